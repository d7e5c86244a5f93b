"""What auditors read about tasks: the dossier of a task (its runs, what the conductor weighed, what
each step was allowed to see, its audit events and their proof), vendor exposure (which vendor received
which data class), and legal holds. Read models over routing's rows and audit's events: they live here,
above both, so that audit knows nothing of routing."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet, Sum

from audit.actions import Action
from audit.chain import run_chain
from audit.exports import checkpoint_reference
from audit.models import AuditEvent, LegalHold
from audit.verify import verify
from routing import folds
from routing.models import ConductorVersion, Run, RunStatus, Step, StepStatus, Task, TaskExposure, UsageRollup
from routing.plans import visible_indices


def vendor_exposure(*, since: datetime | None, until: datetime | None) -> list[dict[str, Any]]:
    """Which vendors received data of which classification: steps that reached a vendor (any call made),
    and answers sent to an LLM judge for grading (with the task and its reference). Finished runs come
    from the rollups (whole hours, whole days read from daily rows: routing.folds.window), runs in flight from their rows; `tasks`
    counts each task once per vendor, in the period its content first reached that vendor."""
    qs = folds.window(UsageRollup.objects.exclude(vendor=""), since, until)
    rows: dict[tuple[str, str], dict[str, Any]] = {}

    def row(vendor: str, classification: str) -> dict[str, Any]:
        return rows.setdefault(
            (vendor, classification),
            {
                "vendor": vendor,
                "run__task__classification": classification,
                "tasks": 0,
                "steps": 0,
                "judged": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost": Decimal("0"),
            },
        )

    for r in (
        qs.order_by()
        .values("vendor", "classification")
        .annotate(
            tasks=Sum("new_tasks"),
            steps=Sum("calls", filter=Q(source=UsageRollup.Source.STEP)),
            judged=Sum("calls", filter=Q(source=UsageRollup.Source.JUDGE)),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cost=Sum("cost_usd"),
        )
    ):
        out = row(r["vendor"], r["classification"])
        for key in ("tasks", "steps", "judged", "input_tokens", "output_tokens", "cost"):
            out[key] += r[key] or 0
    # Runs in flight: their steps that already reached a vendor, from the rows (few: the runs not ended).
    flight = _in_flight(since, until)
    for r in flight.values("vendor", "run__task__classification").annotate(
        steps=Count("id"),
        input_tokens=Sum("input_tokens"),
        output_tokens=Sum("output_tokens"),
        cost=Sum("cost_usd"),
    ):
        out = row(r["vendor"], r["run__task__classification"])
        for key in ("steps", "input_tokens", "output_tokens", "cost"):
            out[key] += r[key] or 0
    for r in (
        flight.exclude(
            Exists(TaskExposure.objects.filter(task_id=OuterRef("run__task_id"), vendor=OuterRef("vendor")))
        )
        .values("vendor", "run__task__classification")
        .annotate(tasks=Count("run__task_id", distinct=True))
    ):
        row(r["vendor"], r["run__task__classification"])["tasks"] += r["tasks"]
    return [rows[key] for key in sorted(rows)]


IN_FLIGHT = (RunStatus.QUEUED, RunStatus.RUNNING)


def _reached(since: datetime | None, until: datetime | None) -> QuerySet[Step]:
    """Steps whose content left for their vendor (reached_vendor, below), in a period."""
    qs = Step.objects.exclude(vendor="").exclude(status=StepStatus.PENDING).filter(started_at__isnull=False)
    if since:
        qs = qs.filter(started_at__gte=since)
    if until:
        qs = qs.filter(started_at__lt=until)
    return qs


def _in_flight(since: datetime | None, until: datetime | None) -> QuerySet[Step]:
    """Steps of runs not ended yet that reached their vendor: found from the runs (few, by their status
    index), not by scanning steps."""
    return (
        _reached(since, until)
        .filter(run_id__in=Run.objects.filter(status__in=IN_FLIGHT).values("pk"))
        .order_by()
    )


def _judge_calls(since: datetime | None, until: datetime | None) -> QuerySet[AuditEvent]:
    """score.judged events where the judge was really asked (it was sent the task and the answer)."""
    qs = AuditEvent.objects.filter(action=Action.SCORE_JUDGED, payload__input_tokens__gt=0).exclude(
        payload__vendor=""
    )
    if since:
        qs = qs.filter(occurred_at__gte=since)
    if until:
        qs = qs.filter(occurred_at__lt=until)
    return qs


def vendor_tasks(
    *, vendor: str, classification: str, since: datetime | None, until: datetime | None, limit: int = 200
) -> list[Task]:
    """The newest tasks of a class whose content reached a vendor (a step's call or an LLM judge) in
    the period: finished runs from TaskExposure (its first and last time overlap the period), runs in
    flight from their rows."""
    folds.fold_for_read()
    seen = TaskExposure.objects.filter(vendor=vendor, classification=classification)
    if since:
        seen = seen.filter(last_at__gte=since)
    if until:
        seen = seen.filter(first_at__lt=until)
    ids = list(seen.order_by("-task_created_at").values_list("task_id", flat=True)[:limit])
    ids += list(
        _in_flight(since, until)
        .filter(vendor=vendor, run__task__classification=classification)
        .values_list("run__task_id", flat=True)
        .distinct()[:limit]
    )
    return list(Task.objects.filter(pk__in=ids).order_by("-created_at")[:limit])


def task_chains(task: Task) -> list[str]:
    return [run_chain(run.correlation_id) for run in task.runs.all()]


VIEWS_SHOWN = 20  # the dossier lists a task's latest views; the event log has every one


def task_events(task: Task) -> QuerySet[AuditEvent]:
    """What happened to a task, its views apart (`task_views`): every look at the record is an event
    too, and a task much looked at would bury its own history under them."""
    return AuditEvent.objects.filter(task_id=task.pk).exclude(action=Action.RECORD_VIEWED).order_by("id")


def task_views(task: Task) -> dict[str, Any]:
    """Who looked at a task's record: each viewer with their count and last look, and the latest views."""
    views = AuditEvent.objects.filter(task_id=task.pk, action=Action.RECORD_VIEWED)
    viewers = list(
        views.order_by()
        .values("actor_name")
        .annotate(n=Count("pk"), last=Max("occurred_at"))
        .order_by("-last")
    )
    return {
        "total": sum(v["n"] for v in viewers),
        "viewers": viewers,
        "latest": list(views.order_by("-id")[:VIEWS_SHOWN]),
        "shown": VIEWS_SHOWN,
    }


def _weighed(alternatives: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """What the conductor weighed for step `index`, as (label, p) whatever the backend's shape:
    an LLM's candidate tokens (with the workers they begin), or the learned policy's workflows."""
    entry = next((a for a in alternatives if a.get("step") == index), None)
    weighed = []
    for c in (entry or {}).get("candidates") or []:
        label = c.get("workflow") or "/".join(c.get("workers") or []) or c.get("token") or "?"
        if c.get("fixed"):
            label += " (the kind's fixed workflow, chosen)"
        elif c.get("chosen"):
            label += " (chosen)"
        weighed.append({"label": label, "p": c.get("p") or 0})
    return weighed


def reached_vendor(step: Step) -> bool:
    """Whether a step's content left for its vendor: a call was made (failed calls included)."""
    return bool(step.vendor) and step.started_at is not None and step.status != StepStatus.PENDING


def task_exposure(task: Task, runs: list[Any]) -> dict[str, Any]:
    """One task's exposure map: which vendor received which piece of its content (each step's
    instruction, and the answers of earlier steps shown to it), under the task's data class; each
    cell names the steps whose call carried it, to link to the exact messages. `runs` carry their
    steps as `dossier_steps` and decisions as `dossier_decisions`. What an LLM conductor was sent to
    plan (the task) and what an LLM judge was sent to grade (answer and reference) are rows of their
    own, their columns named after the conductor version and the judge's vendor."""
    vendors: list[str] = []
    rows: list[dict[str, Any]] = []

    def cell(row: dict[str, Any], vendor: str, step: Step) -> None:
        if vendor not in vendors:
            vendors.append(vendor)
        row["cells"].setdefault(vendor, []).append(step)

    for run in runs:
        planned = [d for d in run.dossier_decisions if d.backend == ConductorVersion.Backend.LLM and d.prompt]
        if planned:  # an LLM conductor was sent the task (and, nested, the answers so far) to plan it
            row = {"run": run.pk, "kind": "plan", "step": None, "cells": {}, "decisions": len(planned)}
            rows.append(row)
            vendor = f"conductor {planned[0].version_name}"
            if vendor not in vendors:
                vendors.append(vendor)
            row["planned"] = {vendor: len(planned)}
        steps = run.dossier_steps
        by_index = {(s.decision_id, s.index): s for s in steps}
        answers: dict[int, dict[str, Any]] = {}
        for step in steps:
            if not reached_vendor(step):
                continue
            row = {"run": run.pk, "kind": "instruction", "step": step, "cells": {}}
            rows.append(row)
            cell(row, step.vendor, step)
            for index in visible_indices(step.access, step.index):
                source = by_index.get((step.decision_id, index))
                if source is None:
                    continue
                if source.pk not in answers:
                    answers[source.pk] = {"run": run.pk, "kind": "answer", "step": source, "cells": {}}
                    rows.append(answers[source.pk])
                cell(answers[source.pk], step.vendor, step)
    judged = list(_judge_calls(None, None).filter(task_id=task.pk).values_list("payload__vendor", flat=True))
    if judged:
        row = {"run": None, "kind": "judge", "step": None, "cells": {}, "judged": {}}
        for vendor in judged:
            if vendor not in vendors:
                vendors.append(vendor)
            row["judged"][vendor] = row["judged"].get(vendor, 0) + 1
        rows.append(row)
    vendors.sort()
    for row in rows:
        row["line"] = [
            (v, row["cells"].get(v, []), row.get("judged", {}).get(v, 0) + row.get("planned", {}).get(v, 0))
            for v in vendors
        ]
    return {"vendors": vendors, "rows": rows, "classification": task.classification}


def exposure_flows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """vendor_exposure's rows as a Sankey's nodes and links: data class -> vendor, weighed by the
    steps (and judge calls) that carried it."""
    classes = sorted({r["run__task__classification"] for r in rows})
    vendors = sorted({r["vendor"] for r in rows})
    nodes = classes + vendors
    links = [
        {
            "source": classes.index(r["run__task__classification"]),
            "target": len(classes) + vendors.index(r["vendor"]),
            "value": r["steps"] + r["judged"],
            "classification": r["run__task__classification"],
            "vendor": r["vendor"],
            "tasks": r["tasks"],
        }
        for r in rows
        if r["steps"] + r["judged"]
    ]
    return {"nodes": nodes, "classes": len(classes), "links": links}


def dossier_context(task: Task) -> dict[str, Any]:
    runs = list(task.runs.all())
    for run in runs:
        decisions = list(run.decisions.all())
        by_decision = {d.pk: d for d in decisions}
        steps = list(run.steps.all())
        for step in steps:
            decision = by_decision.get(step.decision_id)
            step.why_thought = decision.plan.get("thought", "") if decision and decision.plan else ""
            alternatives = decision.alternatives if decision else []
            step.why_alternatives = _weighed(alternatives, step.index)
            verdicts = (decision.policy_checks or {}).get("steps", []) if decision else []
            step.policy = next((v for v in verdicts if v.get("index") == step.index), None)
            indices = visible_indices(step.access, step.index)
            step.saw = [s for s in steps if s.decision_id == step.decision_id and s.index in indices]
        run.dossier_steps = steps
        run.dossier_decisions = decisions
    chains = task_chains(task)
    report = verify(chains=chains) if chains else None
    return {
        "task": task,
        "runs": runs,
        "exposure": task_exposure(task, runs),
        "events": list(task_events(task)),
        "item_sets": list(task_events(task).filter(action=Action.TASK_ADDED_TO_ITEMSET)),
        "views": task_views(task),
        "proof": report,
        "checkpoint": checkpoint_reference(),
        "holds": list(LegalHold.objects.filter(task_id=task.pk).order_by("-placed_at")),
        "retention_days": settings.RETENTION_DAYS.get(task.classification),
    }
