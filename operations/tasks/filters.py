"""The lists' filters (the pages and the API): django-filter FilterSets read strictly."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.db.models import Exists, OuterRef

from routing import selectors
from routing.models import (
    Attempt,
    DataClass,
    Run,
    RunStatus,
    Step,
    StopReason,
    Task,
)
from utilities import params
from utilities.filters import RuleFilter, StrictFilterSet, choice, moment


def known(values: Callable[[], Iterable[str]], **kwargs) -> RuleFilter:
    """One of values that exist now (registered workers, conductor versions), read when the list is."""
    return RuleFilter(lambda data, name: params.choice(data, name, values()), **kwargs)


class TaskFilter(StrictFilterSet):
    status = choice(RunStatus.values)
    classification = choice(DataClass.values)
    source = choice(Task.Source.values)
    worker = known(selectors.worker_slugs, method="with_step", label="a worker that ran one of its steps")
    vendor = RuleFilter(params.text, method="with_step", label="a vendor that received one of its steps")
    conductor = known(
        selectors.conductor_names, method="planned_by", label="the conductor version of one of its runs"
    )
    stop = choice(StopReason.values, method="stopped_by", label="why one of its runs failed")
    q = RuleFilter(
        params.text,
        method="search",
        label="a task id or its first characters (as pages show it), or words of the task (web-search syntax)",
    )
    since = moment(field_name="created_at", lookup_expr="gte", label="submitted at or after (a zone, or UTC)")
    until = moment(
        end=True, field_name="created_at", lookup_expr="lt", label="submitted before (a zone, or UTC)"
    )

    class Meta:
        model = Task
        fields: list[str] = []

    def search(self, queryset, name, value: str):
        return selectors.task_search(queryset, value)

    def with_step(self, queryset, name, value: str):
        field = {"worker": "worker_slug", "vendor": "vendor"}[name]
        return queryset.filter(Exists(Step.objects.filter(run__task=OuterRef("pk"), **{field: value})))

    def stopped_by(self, queryset, name, value: str):
        return queryset.filter(
            Exists(Run.objects.filter(task=OuterRef("pk"), status=RunStatus.FAILED, stop_reason=value))
        )

    def planned_by(self, queryset, name, value: str):
        return queryset.filter(Exists(Run.objects.filter(task=OuterRef("pk"), conductor_version__name=value)))


FAILED = "failed"  # any outcome but success (and a call still in flight)


class AttemptFilter(StrictFilterSet):
    """Provider calls: from a symptom on the overview (a worker's error rate, an alert) to the calls."""

    worker = known(selectors.worker_slugs, field_name="step__worker_slug")
    vendor = RuleFilter(params.text, field_name="step__vendor")
    status = choice(
        [*Attempt.Status.values, FAILED], method="outcome", label="an outcome, or 'failed' for any error"
    )
    task = RuleFilter(params.uuid, field_name="step__run__task_id")
    since = moment(field_name="started_at", lookup_expr="gte")
    until = moment(end=True, field_name="started_at", lookup_expr="lt")

    class Meta:
        model = Attempt
        fields: list[str] = []

    def outcome(self, queryset, name, value: str):
        return (
            queryset.filter(status__in=Attempt.ERRORS) if value == FAILED else queryset.filter(status=value)
        )
