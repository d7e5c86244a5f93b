"""Evaluations: a candidate against a baseline on the same held-out items, and their summary."""

from __future__ import annotations

import statistics
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.actions import Action
from audit.services import Actor, event_record
from routing import replay
from routing.models import ConductorVersion, Decision, Run, RunStatus
from routing.services import conductor_active

from .. import limits
from ..models import Evaluation, EvaluationRun, JobStatus
from .common import (
    FINISHED_RUN,
    MAX_ITEMS,
    SERVICE,
    TrainingError,
    check_or_refuse,
    queued_runs_guard,
    user_of,
)
from .items import item_task, offline_runs, replay_item_ids, replay_items


def _evaluation_checked(
    candidate: ConductorVersion, baseline: ConductorVersion | None, split: str, limit: int
) -> tuple[ConductorVersion, list[replay.ReplayItem]]:

    baseline = baseline or conductor_active()
    if baseline.pk == candidate.pk:
        raise TrainingError(f"{candidate.name} is the baseline itself; choose another candidate")
    if not 1 <= limit <= MAX_ITEMS:
        raise TrainingError(f"evaluate on 1 to {MAX_ITEMS} items")
    check_or_refuse(limits.evaluation_runs_check, limit)
    ids = replay_item_ids(split)
    check_or_refuse(limits.evaluation_limit_check, split, len(ids), limit)  # refused, never capped
    return baseline, replay_items(ids[:limit])


def evaluation_estimate(
    *,
    candidate: ConductorVersion,
    baseline: ConductorVersion | None = None,
    split: str = "dev",
    limit: int = 100,
    user: Any = None,
) -> limits.Estimate:
    """What evaluation_start would start (runs, estimated cost), checked as it checks; starts nothing."""
    baseline, found = _evaluation_checked(candidate, baseline, split, limit)
    check_or_refuse(limits.queued_runs_check, user, len(found) * limits.EVALUATION_SIDES)
    return limits.estimate([(candidate, len(found)), (baseline, len(found))])


def evaluation_start(
    *,
    candidate: ConductorVersion,
    baseline: ConductorVersion | None = None,
    split: str = "dev",
    limit: int = 100,
    actor: Actor,
    user: Any = None,
) -> Evaluation:
    """Run the candidate and the baseline (the active version by default) on the same held-out items.
    Refused (nothing written) above training.limits' runs per request or the user's queued runs, or
    when `limit` is more than the split's items."""
    baseline, found = _evaluation_checked(candidate, baseline, split, limit)
    with transaction.atomic():
        queued_runs_guard(user, len(found) * limits.EVALUATION_SIDES)
        evaluation = Evaluation.objects.create(
            candidate=candidate,
            baseline=baseline,
            split=split,
            limit=limit,
            items=[i.id for i in found],
            status=JobStatus.RUNNING,
            created_by=user_of(user),
        )
        sides = (("candidate", candidate), ("baseline", baseline))
        tasks = [(item, item_task(item, actor)) for item in found]
        runs = iter(
            offline_runs([(task, version) for _, task in tasks for _, version in sides], Run.Kind.EVALUATION)
        )
        EvaluationRun.objects.bulk_create(
            [
                EvaluationRun(evaluation=evaluation, run=next(runs), side=side, item=item.id)
                for item, _ in tasks
                for side, _ in sides
            ]
        )
        event_record(
            actor=actor,
            action=Action.EVALUATION_STARTED,
            obj=evaluation,
            payload={
                "candidate": candidate.name,
                "baseline": baseline.name,
                "split": split,
                "items": len(found),
            },
        )
    return evaluation


def _p95(values: list[float]) -> float | None:
    """The 95th percentile with linear interpolation: PostgreSQL's percentile_cont, as the ops page
    computes it (routing.ops.Percentile)."""
    if not values:
        return None
    if len(values) == 1:
        return round(float(values[0]), 1)
    return round(statistics.quantiles(values, n=20, method="inclusive")[-1], 1)


def evaluation_summary(evaluation: Evaluation) -> dict[str, dict[str, Any]]:
    """Per side: accuracy (a failed run counts as wrong), USD per 1,000 tasks, p95 plan latency.

    While runs are still going, every figure is over the runs that have ended: `n` is how many that
    is (the items scored so far), `total` how many the side has in all; done when n == total.
    """
    results: dict[str, dict[str, Any]] = {}
    links = EvaluationRun.objects.filter(evaluation=evaluation).select_related("run")
    plan_ms: dict[int, float] = {}
    for run_id, latency in Decision.objects.filter(
        run__evaluation_run__evaluation=evaluation, depth=0
    ).values_list("run_id", "latency_ms"):
        plan_ms[run_id] = plan_ms.get(run_id, 0) + latency
    for side, version in (("candidate", evaluation.candidate), ("baseline", evaluation.baseline)):
        runs = [link.run for link in links if link.side == side]
        finished = [r for r in runs if r.status in FINISHED_RUN]
        cost = sum((r.cost_usd for r in finished), Decimal("0"))
        results[side] = {
            "version": version.name,
            "n": len(finished),
            "total": len(runs),
            "finished": len(finished),
            "failed": sum(r.status == RunStatus.FAILED for r in finished),
            "accuracy": round(sum(r.score or 0.0 for r in finished) / len(finished), 4) if finished else None,
            "usd_per_1000": str((cost / len(finished) * 1000).quantize(Decimal("0.0001")))
            if finished
            else None,
            "p95_plan_ms": _p95([plan_ms[r.pk] for r in finished if r.pk in plan_ms]),
        }
    return results


def evaluation_refresh(evaluation: Evaluation) -> Evaluation:
    """Recompute the results; the first time every run has ended, the evaluation finishes (audited)."""
    results = evaluation_summary(evaluation)
    done = all(side["finished"] == side["total"] for side in results.values())
    with transaction.atomic():
        locked = Evaluation.objects.select_for_update().get(pk=evaluation.pk)
        locked.results = results
        fields = ["results"]
        if done and locked.status == JobStatus.RUNNING:
            locked.status, locked.finished_at = JobStatus.SUCCEEDED, timezone.now()
            fields += ["status", "finished_at"]
            event_record(
                actor=SERVICE,
                action=Action.EVALUATION_FINISHED,
                obj=locked,
                payload=results,
            )
        locked.save(update_fields=fields)
    return locked
