"""Evaluations: a candidate against a baseline on the same held-out items, and their summary."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import numpy
from django.db import transaction
from django.utils import timezone

from audit.actions import Action
from audit.services import Actor, event_record
from routing.models import ConductorVersion, Decision, Run, RunStatus
from routing.services import conductor_active

from .. import quotas
from ..durations import evaluation_duration_estimate
from ..itemsets.selectors import REPLAY_SET, Resolved, resolve, split_ids
from ..models import Evaluation, EvaluationRun, JobStatus
from .adapters import adapter_load
from .common import (
    FINISHED_RUN,
    MAX_ITEMS,
    SERVICE,
    TrainingError,
    check_or_refuse,
    queued_runs_guard,
    user_of,
)
from .items import item_task, offline_runs, version_in_use


def _evaluation_checked(
    candidate: ConductorVersion, baseline: ConductorVersion | None, split: str, limit: int, item_set: str
) -> tuple[ConductorVersion, Resolved]:

    baseline = baseline or conductor_active()
    if baseline.pk == candidate.pk:
        raise TrainingError(f"{candidate.name} is the baseline itself; choose another candidate")
    if not 1 <= limit <= MAX_ITEMS:
        raise TrainingError(f"evaluate on 1 to {MAX_ITEMS} items")
    check_or_refuse(quotas.evaluation_runs_check, limit)
    ids = split_ids(item_set, split)
    check_or_refuse(quotas.evaluation_limit_check, split, len(ids), limit)  # refused, never capped
    return baseline, resolve(item_set, ids[:limit])


def evaluation_estimate(
    *,
    candidate: ConductorVersion,
    baseline: ConductorVersion | None = None,
    split: str = "dev",
    limit: int = 100,
    user: Any = None,
    item_set: str = REPLAY_SET,
) -> quotas.Estimate:
    """What evaluation_start would start (runs, estimated cost and duration), checked as it checks;
    starts nothing."""
    baseline, resolved = _evaluation_checked(candidate, baseline, split, limit, item_set)
    found = resolved.items
    check_or_refuse(quotas.queued_runs_check, user, len(found) * quotas.EVALUATION_SIDES)
    cost = quotas.estimate([(candidate, len(found)), (baseline, len(found))])
    return replace(cost, duration=evaluation_duration_estimate(candidate, baseline, len(found)))


def evaluation_start(
    *,
    candidate: ConductorVersion,
    baseline: ConductorVersion | None = None,
    split: str = "dev",
    limit: int = 100,
    actor: Actor,
    user: Any = None,
    item_set: str = REPLAY_SET,
    shown_usd: Decimal | None = None,
    max_usd: Decimal | None = None,
) -> Evaluation:
    """Run the candidate and the baseline (the active version by default) on the same held-out items of
    `item_set`'s split (its latest version, frozen by this). Refused (nothing written) above
    training.quotas' runs per request or the user's queued runs, or when `limit` is more than the
    split's items, when the estimate is not the `shown_usd` a preview showed, or above the budget
    `max_usd`."""
    baseline, resolved = _evaluation_checked(candidate, baseline, split, limit, item_set)
    found = resolved.items
    if shown_usd is not None or max_usd is not None:
        found_estimate = quotas.estimate([(candidate, len(found)), (baseline, len(found))])
        check_or_refuse(quotas.estimate_check, found_estimate, shown_usd, max_usd)
    for version in (candidate, baseline):  # a trained adapter is served before a run asks it to plan
        adapter_load(version)
    with transaction.atomic():
        queued_runs_guard(user, len(found) * quotas.EVALUATION_SIDES)
        set_version = version_in_use(resolved, actor, why="evaluation")
        evaluation = Evaluation.objects.create(
            candidate=candidate,
            baseline=baseline,
            split=split,
            item_set=resolved.item_set,
            item_set_version=set_version,
            limit=limit,
            items=[i.id for i in found],
            status=JobStatus.RUNNING,
            created_by=user_of(user),
        )
        sides = (("candidate", candidate), ("baseline", baseline))
        tasks = [(item, item_task(item, actor)) for item in found]
        runs = iter(
            offline_runs(
                [
                    Run(task=task, conductor_version=version, kind=Run.Kind.EVALUATION)
                    for _, task in tasks
                    for _, version in sides
                ]
            )
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
                "item_set": resolved.item_set,
                "item_set_version": set_version.number if set_version else None,
                "content_hash": set_version.content_hash if set_version else None,
                "expected_seconds": round(
                    evaluation_duration_estimate(candidate, baseline, len(found)).seconds, 1
                ),
            },
        )
    return evaluation


def _p95(values: list[float]) -> float | None:
    """The 95th percentile with linear interpolation: PostgreSQL's percentile_cont, as the ops page
    computes it (operations.overview.figures.Percentile)."""
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


# --- Candidate against baseline, item by item ------------------------------------------------------

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
PER_1000 = Decimal(1000)
USD = Decimal("0.0001")


@dataclass(frozen=True)
class Delta:
    """Candidate minus baseline, averaged over the items both sides have finished, with a paired
    bootstrap confidence interval (None under two items)."""

    candidate: Any
    baseline: Any
    delta: Any
    low: Any = None
    high: Any = None

    @property
    def verdict(self) -> str:
        """'higher', 'lower' or 'unclear': whether the candidate's interval leaves zero out, and on
        which side (higher accuracy is better, higher cost worse)."""
        if self.low is None or self.high is None:
            return "unclear"
        if self.low > 0:
            return "higher"
        if self.high < 0:
            return "lower"
        return "unclear"


@dataclass(frozen=True)
class ItemPair:
    item: str
    domain: str
    task_id: Any
    candidate_run: int
    baseline_run: int
    candidate_score: float
    baseline_score: float
    candidate_usd: Decimal
    baseline_usd: Decimal


@dataclass
class Comparison:
    """What decides a promotion: the paired deltas, per domain, and the items won and lost."""

    items: int
    pairs: list[ItemPair]
    accuracy: Delta | None = None
    usd_per_1000: Delta | None = None
    domains: list[dict[str, Any]] = field(default_factory=list)

    @property
    def won(self) -> list[ItemPair]:
        return [p for p in self.pairs if p.candidate_score > p.baseline_score]

    @property
    def lost(self) -> list[ItemPair]:
        return [p for p in self.pairs if p.candidate_score < p.baseline_score]

    @property
    def ties(self) -> int:
        return len(self.pairs) - len(self.won) - len(self.lost)

    @property
    def dominated(self) -> bool:
        """The baseline dominates the candidate on these items: the candidate is not more accurate and
        not cheaper, and worse on one of the two. On the point estimates (the means over the paired
        items), not the intervals: a candidate that is merely not shown to be worse is not promoted
        over a version that did as well for less, unless an admin overrides the gate."""
        a, c = self.accuracy, self.usd_per_1000
        if a is None or c is None:
            return False
        return a.delta <= 0 and c.delta >= 0 and (a.delta < 0 or c.delta > 0)

    def evidence(self) -> dict[str, Any]:
        """The figures a promotion states (and its audit event keeps)."""

        def side(d: Delta | None) -> dict[str, str | None] | None:
            if d is None:
                return None
            return {k: None if v is None else str(v) for k, v in vars(d).items()}

        return {
            "pairs": len(self.pairs),
            "items": self.items,
            "accuracy": side(self.accuracy),
            "usd_per_1000": side(self.usd_per_1000),
            "won": len(self.won),
            "lost": len(self.lost),
            "dominated": self.dominated,
        }


def bootstrap_interval(differences: list[float], *, seed: int) -> tuple[float, float] | None:
    """The paired bootstrap's central CONFIDENCE interval of the mean difference: items resampled
    with replacement BOOTSTRAP_RESAMPLES times (a fixed seed: the page shows the same interval on
    every visit)."""
    if len(differences) < 2:
        return None
    values = numpy.asarray(differences, dtype=float)
    rng = numpy.random.default_rng(seed)
    chunk = max(1, 1_000_000 // len(values))  # resamples drawn at once: about 8 MB of indices at most
    means = numpy.concatenate(
        [
            values[
                rng.integers(0, len(values), size=(min(chunk, BOOTSTRAP_RESAMPLES - done), len(values)))
            ].mean(axis=1)
            for done in range(0, BOOTSTRAP_RESAMPLES, chunk)
        ]
    )
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = numpy.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def _score(run: Run) -> float:
    return float(run.score or 0.0) if run.status == RunStatus.SUCCEEDED else 0.0  # a failed run is wrong


def evaluation_comparison(evaluation: Evaluation) -> Comparison:
    """The candidate against the baseline on the items both have finished: accuracy and cost deltas
    with bootstrap intervals, per domain, and the items each side won."""
    sides: dict[str, dict[str, Run]] = {}
    for link in EvaluationRun.objects.filter(evaluation=evaluation).select_related("run__task"):
        sides.setdefault(link.item, {})[link.side] = link.run
    pairs = []
    for item, runs in sides.items():
        candidate, baseline = runs.get("candidate"), runs.get("baseline")
        if candidate is None or baseline is None:
            continue
        if candidate.status not in FINISHED_RUN or baseline.status not in FINISHED_RUN:
            continue
        pairs.append(
            ItemPair(
                item=item,
                domain=candidate.task.domain or "—",
                task_id=candidate.task_id,
                candidate_run=candidate.pk,
                baseline_run=baseline.pk,
                candidate_score=_score(candidate),
                baseline_score=_score(baseline),
                candidate_usd=candidate.cost_usd,
                baseline_usd=baseline.cost_usd,
            )
        )
    pairs.sort(key=lambda p: (p.domain, p.item))
    comparison = Comparison(items=len(sides), pairs=pairs)
    if not pairs:
        return comparison
    seed = evaluation.pk or 0
    comparison.accuracy = _accuracy_delta(pairs, seed)
    n = Decimal(len(pairs))
    candidate_usd = sum((p.candidate_usd for p in pairs), Decimal(0)) / n * PER_1000
    baseline_usd = sum((p.baseline_usd for p in pairs), Decimal(0)) / n * PER_1000
    interval = bootstrap_interval([float(p.candidate_usd - p.baseline_usd) for p in pairs], seed=seed)
    comparison.usd_per_1000 = Delta(
        candidate=candidate_usd.quantize(USD),
        baseline=baseline_usd.quantize(USD),
        delta=(candidate_usd - baseline_usd).quantize(USD),
        low=None if interval is None else (Decimal(str(interval[0])) * PER_1000).quantize(USD),
        high=None if interval is None else (Decimal(str(interval[1])) * PER_1000).quantize(USD),
    )
    by_domain: dict[str, list[ItemPair]] = {}
    for pair in pairs:
        by_domain.setdefault(pair.domain, []).append(pair)
    comparison.domains = [
        {
            "domain": domain,
            "n": len(group),
            "accuracy": _accuracy_delta(group, seed),
            "won": sum(p.candidate_score > p.baseline_score for p in group),
            "lost": sum(p.candidate_score < p.baseline_score for p in group),
        }
        for domain, group in sorted(by_domain.items())
    ]
    return comparison


def _accuracy_delta(pairs: list[ItemPair], seed: int) -> Delta:
    candidate = statistics.fmean(p.candidate_score for p in pairs)
    baseline = statistics.fmean(p.baseline_score for p in pairs)
    interval = bootstrap_interval([p.candidate_score - p.baseline_score for p in pairs], seed=seed)
    return Delta(
        candidate=round(candidate, 4),
        baseline=round(baseline, 4),
        delta=round(candidate - baseline, 4),
        low=None if interval is None else round(interval[0], 4),
        high=None if interval is None else round(interval[1], 4),
    )
