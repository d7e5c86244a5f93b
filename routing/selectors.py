"""Reads for the routing app."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.contrib.postgres.aggregates import ArrayAgg
from django.contrib.postgres.search import SearchQuery
from django.db.models import DurationField, F, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from .models import CONDUCTOR_SLUG, Attempt, ConductorVersion, Decision, Run, Step, StepStatus, Task, Worker

ANSWERING_KINDS = (Run.Kind.LIVE, Run.Kind.RETRY)  # the runs that set a task's status and answer


def final_worker(field: str = "worker_slug", **runs: Any) -> Subquery:
    """The worker that gave the final answer of the runs selected by `runs` (lookups on Step), as an
    expression: the last step to succeed that is not the conductor's own. A conductor step only
    passes on the answer of the nested plan it wrote; the worker that wrote that answer is the one.
    `field`: what of that step (its worker's slug, or e.g. `worker__weak`)."""
    steps = Step.objects.filter(status=StepStatus.SUCCEEDED, **runs).exclude(worker_slug=CONDUCTOR_SLUG)
    return Subquery(steps.order_by("-finished_at", "-id").values(field)[:1])


def with_final_worker(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """`tasks` with the worker that gave each one's final answer (`final_worker`, its slug) and whether
    that worker is marked weak (`final_answer_weak`): such an answer is labelled so wherever it is shown."""
    answering = {"run__task": OuterRef("pk"), "run__kind__in": ANSWERING_KINDS}
    return tasks.annotate(
        final_worker=final_worker(**answering),
        final_answer_weak=Coalesce(final_worker("worker__weak", **answering), False),
    )


def task_list() -> QuerySet[Task]:
    """Tasks as lists show them (filtered by operations.tasks.filters.TaskFilter)."""
    return Task.objects.defer("final_answer", "search_vector")


def with_answerers(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """`tasks` with the columns of the task list's page: the final worker (weak or not), the vendors that
    received their live runs' steps, and how long the last answering run ran, from its start to its end
    (the task's latency_s also counts the time queued). Subqueries, run for the rows of one page only."""
    vendors = (
        Step.objects.filter(run__task=OuterRef("pk"), run__kind__in=ANSWERING_KINDS)
        .exclude(vendor="")
        .order_by()
        .values("run__task")
        .annotate(names=ArrayAgg("vendor", distinct=True, order_by="vendor"))
        .values("names")
    )
    return with_final_worker(tasks).annotate(
        vendors=Subquery(vendors),
        ran=Subquery(
            Run.objects.filter(task=OuterRef("pk"), kind__in=ANSWERING_KINDS, finished_at__isnull=False)
            .order_by("-finished_at")
            .annotate(ran=F("finished_at") - F("started_at"))
            .values("ran")[:1],
            output_field=DurationField(),
        ),
    )


SHORT_ID = re.compile(r"[0-9a-f]{4,32}")


def task_search(qs: QuerySet[Task], search: str) -> QuerySet[Task]:
    """A task id, whole or its first characters as the pages show it (`c3075229`), or words in the task
    text (PostgreSQL full-text search, web-search syntax: "quoted phrases", -excluded, or), served by
    the task_text_search GIN index. An id's prefix is a range of the primary key (its btree index);
    a prefix that is also a word ("cafe") finds both."""
    text = search.strip()
    try:
        return qs.filter(pk=uuid.UUID(text))
    except ValueError:
        pass
    words = Q(search_vector=SearchQuery(search, config="english", search_type="websearch"))
    prefix = text.lower().replace("-", "")
    if SHORT_ID.fullmatch(prefix):
        return qs.filter(id_prefix(prefix) | words)
    return qs.filter(words)


def id_prefix(prefix: str) -> Q:
    """The ids that start with `prefix` (hex digits, as SHORT_ID matches): a range of the primary key,
    served by its btree index."""
    return Q(pk__gte=uuid.UUID(prefix.ljust(32, "0")), pk__lte=uuid.UUID(prefix.ljust(32, "f")))


def tasks_by_short_id(prefix: str, limit: int = 2) -> list[uuid.UUID]:
    """The ids of tasks whose id starts with `prefix` (the pages' 8-character ids), at most `limit`."""
    return list(Task.objects.filter(id_prefix(prefix)).order_by("pk").values_list("pk", flat=True)[:limit])


def run_detail_queryset() -> QuerySet[Run]:
    return Run.objects.select_related("conductor_version", "task").prefetch_related(
        Prefetch(
            "decisions", queryset=Decision.objects.select_related("parent_step").order_by("depth", "id")
        ),
        Prefetch(
            "steps",
            queryset=Step.objects.select_related("worker").prefetch_related(
                Prefetch("attempts", queryset=Attempt.objects.order_by("number"))
            ),
        ),
    )


def task_detail(*, task_id) -> Task:
    tasks = with_final_worker(Task.objects.all())
    return tasks.prefetch_related(Prefetch("runs", queryset=run_detail_queryset())).get(pk=task_id)


def attempt_list() -> QuerySet[Attempt]:
    """Provider calls as the attempts page lists them, with the step, run and task they belong to."""
    return Attempt.objects.select_related("step__run__task").defer(
        "step__messages_sent",
        "step__response",
        "step__run__task__final_answer",
        "step__run__task__search_vector",
    )


def vendor_names() -> list[str]:
    """The vendors of the pool's workers (the vendor filter also takes any other name, as text)."""
    return sorted(set(Worker.objects.exclude(vendor="").values_list("vendor", flat=True)))


def worker_list(*, enabled_only: bool = False) -> QuerySet[Worker]:
    qs = Worker.objects.all()
    return qs.filter(enabled=True) if enabled_only else qs


def worker_slugs() -> list[str]:
    """Every registered worker's slug and the conductor's: what a filter by worker may name."""
    return sorted([*Worker.objects.values_list("slug", flat=True), CONDUCTOR_SLUG])


def conductor_names() -> list[str]:
    return sorted(ConductorVersion.objects.values_list("name", flat=True))
