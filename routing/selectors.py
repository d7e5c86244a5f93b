"""Reads for the routing app."""

from __future__ import annotations

import uuid

from django.contrib.postgres.search import SearchQuery
from django.db.models import Prefetch, QuerySet

from .models import Attempt, Decision, Run, Step, Task, Worker


def task_list() -> QuerySet[Task]:
    """Tasks as lists show them (filtered by routing.filters.TaskFilter)."""
    return Task.objects.defer("final_answer", "search_vector")


def task_search(qs: QuerySet[Task], search: str) -> QuerySet[Task]:
    """A task id, or words in the task text (PostgreSQL full-text search, web-search syntax: "quoted
    phrases", -excluded, or), served by the task_text_search GIN index."""
    try:
        return qs.filter(pk=uuid.UUID(search.strip()))
    except ValueError:
        pass
    return qs.filter(search_vector=SearchQuery(search, config="english", search_type="websearch"))


def run_detail_queryset() -> QuerySet[Run]:
    return Run.objects.select_related("conductor_version", "task").prefetch_related(
        Prefetch("decisions", queryset=Decision.objects.order_by("depth", "id")),
        Prefetch(
            "steps",
            queryset=Step.objects.select_related("worker").prefetch_related(
                Prefetch("attempts", queryset=Attempt.objects.order_by("number"))
            ),
        ),
    )


def task_detail(*, task_id) -> Task:
    return Task.objects.prefetch_related(Prefetch("runs", queryset=run_detail_queryset())).get(pk=task_id)


def worker_list(*, enabled_only: bool = False) -> QuerySet[Worker]:
    qs = Worker.objects.all()
    return qs.filter(enabled=True) if enabled_only else qs
