"""The task list's filters (the page and the API): a django-filter FilterSet read strictly."""

from __future__ import annotations

from audit import params
from audit.filters import RuleFilter, StrictFilterSet, choice

from . import selectors
from .models import DataClass, RunStatus, Task


class TaskFilter(StrictFilterSet):
    status = choice(RunStatus.values)
    classification = choice(DataClass.values)
    q = RuleFilter(params.text, method="search", label="a task id, or words of the task (web-search syntax)")

    class Meta:
        model = Task
        fields: list[str] = []

    def search(self, queryset, name, value: str):
        return selectors.task_search(queryset, value)
