"""Saved views: a task list's filters kept under a name."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SavedView(models.Model):
    """A task list's filters under a name: its query string (validated by operations.tasks.filters.TaskFilter
    when saved), opened as /views/<id>/. Its owner sees it; everyone who reads tasks does once shared."""

    NAME_MAX = 100
    QUERY_MAX = 2000

    name = models.CharField(max_length=NAME_MAX)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    query = models.CharField(max_length=QUERY_MAX, blank=True)
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return f"View {self.name!r}"
