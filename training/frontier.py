"""The learned conductor's accuracy/cost frontier, chosen by cross-validation on the training items only.

For each cost penalty λ (reward = correct - λ x USD) of a grid:

1. K-fold cross-validation on the training items: in each fold, the policy is trained with GRPO on the
   other folds, and so is each kind's best fixed workflow (the one workflow with the highest mean
   reward on that kind's items of the other folds); both then plan the held-out fold.
2. The gate, per kind: the learned choice is kept for a kind only where, out of fold, it earned more
   than the kind's fixed workflow by at least GATE_Z standard errors of the paired difference; elsewhere
   the policy falls back to the fixed workflow (regularised toward "the best fixed workflow for this
   kind of task", never toward noise from hashed words). Kinds the policy never saw are planned from
   the text alone (training.kinds).
3. The point: accuracy and USD per 1,000 tasks of the gated policy, out of fold.

The frontier is the points no other point beats on both accuracy and cost. Every fixed policy that
plans by kind (a single worker, a cascade, the static rules) is one of the combinations the per-kind
fallback chooses from, so on the training items the gated policy at a matching λ is at least as good;
the held-out check is the benchmark's (bench/routing_quality.py).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .policy import GRPOConfig, Policy, Table, Workflow, outcome_table, train

# USD^-1. 0 is "accuracy only"; above about 1,000 every kind takes its cheapest worker.
COST_PENALTIES = (0.0, 3.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0, 50.0, 200.0, 1000.0)
FOLDS = 5
# The gate keeps a kind's learned choice only where it beat the kind's fixed workflow out of fold by at
# least this many standard errors of the paired difference (1.645: one-sided 95%).
GATE_Z = 1.645
PER_1000 = 1000


def fold_of(items: Sequence[Any], folds: int) -> np.ndarray:
    """Each item's fold, from a hash of its id (or text): the same item is in the same fold in every run."""
    keys = [str(getattr(item, "id", "") or item.task) for item in items]
    return np.array([int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) % folds for k in keys])


def best_fixed(rewards: np.ndarray, kinds: np.ndarray) -> dict[str, int]:
    """Each kind's (and "": the unseen kinds') best fixed workflow: the highest mean reward over its
    rows (ties go to the first workflow: single workers come first)."""
    return {str(k): int(np.argmax(rewards[kinds == k].mean(axis=0))) for k in np.unique(kinds)}


@dataclass
class KindGate:
    kind: str
    items: int
    learned_reward: float  # mean reward out of fold
    fixed_reward: float
    fixed_workflow: str  # the kind's best fixed workflow on all the training items
    learned: bool  # the learned choice is kept for this kind


@dataclass
class Point:
    """The gated policy at one cost penalty, measured out of fold on the training items."""

    cost_penalty_per_usd: float
    accuracy: float
    usd_per_1000: float
    gates: list[KindGate] = field(default_factory=list)
    on_frontier: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Fit:
    """The sweep over cost penalties: every point, and what is needed to train one of them."""

    points: list[Point]
    folds: int
    items: int
    table: Table = field(repr=False)
    workflows: list[str] = field(default_factory=list)

    @property
    def frontier(self) -> list[Point]:
        return [p for p in self.points if p.on_frontier]

    def point(self, cost_penalty_per_usd: float) -> Point:
        return min(self.points, key=lambda p: abs(p.cost_penalty_per_usd - cost_penalty_per_usd))

    def summary(self) -> dict[str, Any]:
        """What a saved policy keeps of the sweep (the training page plots it)."""
        return {
            "folds": self.folds,
            "items": self.items,
            "points": [
                {
                    "cost_penalty_per_usd": p.cost_penalty_per_usd,
                    "accuracy": round(p.accuracy, 4),
                    "usd_per_1000": round(p.usd_per_1000, 4),
                    "on_frontier": p.on_frontier,
                    "learned_kinds": [g.kind for g in p.gates if g.learned],
                }
                for p in self.points
            ],
            # Each fixed workflow for every item (in sample): what the curve is drawn against.
            "fixed": [
                {
                    "workflow": name,
                    "accuracy": round(float(self.table.correct[:, i].mean()), 4),
                    "usd_per_1000": round(float(self.table.cost[:, i].mean()) * PER_1000, 4),
                }
                for i, name in enumerate(self.workflows)
            ],
        }


def kinds_column(policy: Policy, items: Sequence[Any]) -> np.ndarray:
    return np.array([policy.kind(item.domain) for item in items], dtype=object)


def _choices(policy: Policy, items: Sequence[Any]) -> np.ndarray:
    """The learned choice for each item (no fallback)."""
    return np.array(
        [int(np.argmax(policy.probabilities(policy.featurize(i.task, i.domain)))) for i in items], dtype=int
    )


def _gates(
    rewards: np.ndarray, kinds: np.ndarray, learned: np.ndarray, fixed: np.ndarray, fixed_all: dict[str, str]
) -> list[KindGate]:
    rows = np.arange(len(kinds))
    difference = rewards[rows, learned] - rewards[rows, fixed]
    gates = []
    for kind in sorted({str(k) for k in kinds if k}):  # "" (unseen kinds) always takes the text-only path
        mask = kinds == kind
        d = difference[mask]
        standard_error = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.inf
        gates.append(
            KindGate(
                kind=kind,
                items=int(mask.sum()),
                learned_reward=round(float(rewards[rows, learned][mask].mean()), 5),
                fixed_reward=round(float(rewards[rows, fixed][mask].mean()), 5),
                fixed_workflow=str(fixed_all[kind]),
                learned=bool(d.mean() > 0 and d.mean() >= GATE_Z * standard_error),
            )
        )
    return gates


def sweep(
    actions: list[Workflow],
    items: Sequence[Any],
    make_policy: Callable[[], Policy],
    config: GRPOConfig,
    *,
    penalties: Sequence[float] = COST_PENALTIES,
    folds: int = FOLDS,
    on_fold: Callable[[int, int], None] | None = None,
) -> Fit:
    """Cross-validate the gated policy at every cost penalty (see the module's docstring).
    `make_policy()`: an untrained policy over `actions` that knows the items' kinds; `on_fold(done,
    total)` is called after each training (a job's progress; it may raise to stop)."""
    items = list(items)
    template = make_policy()
    table = outcome_table(actions, items, template.scorers)
    kinds = kinds_column(template, items)
    fold = fold_of(items, folds)
    rows = np.arange(len(items))
    points: list[Point] = []
    for penalty in penalties:
        rewards = table.rewards(penalty)
        learned = np.zeros(len(items), dtype=int)
        fixed = np.zeros(len(items), dtype=int)
        for f in range(folds):
            held, kept = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
            if not len(held) or not len(kept):
                continue
            policy = make_policy()
            train(
                policy,
                [items[i] for i in kept],
                replace(config, cost_penalty_per_usd=penalty),
                table=table.rows(kept),
            )
            learned[held] = _choices(policy, [items[i] for i in held])
            if on_fold is not None:
                on_fold(len(points) * folds + f + 1, len(penalties) * folds)
            per_kind = best_fixed(rewards[kept], kinds[kept])
            overall = int(np.argmax(rewards[kept].mean(axis=0)))
            fixed[held] = [per_kind.get(str(k), overall) for k in kinds[held]]
        fixed_all = best_fixed(rewards, kinds)
        gates = _gates(rewards, kinds, learned, fixed, {k: actions[i].name for k, i in fixed_all.items()})
        trusted = {g.kind for g in gates if g.learned} | {""}
        chosen = np.where([str(k) in trusted for k in kinds], learned, fixed)
        point = Point(
            cost_penalty_per_usd=float(penalty),
            accuracy=float(table.correct[rows, chosen].mean()),
            usd_per_1000=float(table.cost[rows, chosen].mean() * PER_1000),
            gates=gates,
        )
        points.append(point)
    for p in points:
        p.on_frontier = not any(
            dominates(q.accuracy, q.usd_per_1000, p.accuracy, p.usd_per_1000) for q in points
        )
    return Fit(points=points, folds=folds, items=len(items), table=table, workflows=[a.name for a in actions])


def dominates(accuracy: float, cost: float, other_accuracy: float, other_cost: float) -> bool:
    """(accuracy, cost) is at least as accurate and as cheap as the other, and better on one."""
    return (
        accuracy >= other_accuracy and cost <= other_cost and (accuracy > other_accuracy or cost < other_cost)
    )


def gate_policy(policy: Policy, items: Sequence[Any], fit: Fit) -> Policy:
    """Give a policy trained on all of `fit`'s items (at a penalty of the sweep) the sweep's gate at its
    penalty: each kind where the learned choice was not trusted falls back to the kind's best fixed
    workflow on all the items. Keeps the sweep's summary in the policy (`frontier`)."""
    penalty = float(policy.cost_penalty_per_usd or 0.0)
    point = fit.point(penalty)
    fixed = best_fixed(fit.table.rewards(penalty), kinds_column(policy, items))
    policy.fallback = {g.kind: fixed[g.kind] for g in point.gates if not g.learned and g.kind in fixed}
    policy.frontier = {**fit.summary(), "chosen": point.cost_penalty_per_usd}
    return policy
