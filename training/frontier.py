"""The learned conductor's accuracy/cost frontier, chosen by cross-validation on the training items only.

For each cost penalty λ (reward = correct - λ x USD) of a grid:

1. K-fold cross-validation on the training items: in each fold, the policy is trained with GRPO on the
   other folds, and so is each kind's best fixed workflow (the one workflow with the highest mean
   reward on that kind's items of the other folds); both then plan the held-out fold.
2. The gate, per kind: the learned choice is kept for a kind only where, out of fold, it earned more
   than the kind's fixed workflow by at least z standard errors of the paired difference; elsewhere
   the policy falls back to the fixed workflow (regularised toward "the best fixed workflow for this
   kind of task", never toward noise from hashed words). Kinds the policy never saw are planned from
   the text alone (training.kinds). z is chosen per penalty from GATE_ZS by cross-validating the gate
   itself on the same out-of-fold choices: each fold is planned by the gates the other folds set, and
   by the one-standard-error rule the largest z whose reward is within one standard error of the best
   z's wins (fall back when the difference is within the folds' noise).
3. The point: accuracy and USD per 1,000 tasks of the gated policy, out of fold.
   The point's figures are those of the procedure, out of fold: each fold's kinds gated by the other
   folds' rows. The gates a policy trained on every item gets (gate_policy) are read from every row.
4. Gaps: where two neighbouring penalties' points lie far apart in cost (more than GAP_USD_PER_1000),
   the penalty halfway between them is swept too, widest gap first, up to `refine` more penalties, so
   that the curve has a point near every cost a fixed policy stands at. An interval a split did not
   narrow (one half kept JUMP_SHARE of the gap: a kind's choice flips at one penalty) is not split again.

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
from itertools import pairwise
from typing import Any

import numpy as np

from .kinds import MIN_KIND_ITEMS
from .policy import GRPOConfig, Policy, Table, Workflow, outcome_table, train

# USD^-1. 0 is "accuracy only"; above about 1,000 every kind takes its cheapest worker.
COST_PENALTIES = (0.0, 3.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0, 50.0, 200.0, 1000.0)
FOLDS = 5
# The gate keeps a kind's learned choice only where it beat the kind's fixed workflow out of fold by at
# least z standard errors of the paired difference; z is one of these, chosen by cross-validation on the
# training items (inf: always the fixed workflow).
GATE_ZS = (0.0, 1.0, 1.645, 2.326, math.inf)
# Neighbouring points further apart than this (USD per 1,000 tasks) get a penalty swept between them
# (a fixed policy's cost is read to about this precision on a few hundred items), up to REFINE times;
# penalties closer than MIN_PENALTY_STEP are not split; a half left with JUMP_SHARE of its interval's
# gap is a jump, not split again.
GAP_USD_PER_1000 = 0.5
REFINE = 3
MIN_PENALTY_STEP = 0.5
JUMP_SHARE = 0.9
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
    z: float = 0.0  # the paired difference's mean in standard errors (out of fold)


@dataclass
class Point:
    """The gated policy at one cost penalty, measured out of fold on the training items."""

    cost_penalty_per_usd: float
    accuracy: float
    usd_per_1000: float
    gates: list[KindGate] = field(default_factory=list)
    on_frontier: bool = False
    gate_z: float = math.inf  # the gate's threshold, chosen by cross-validation (GATE_ZS)

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
                    "gate_z": p.gate_z if math.isfinite(p.gate_z) else None,
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


def _z_scores(difference: np.ndarray, kinds: np.ndarray, rows: np.ndarray) -> dict[str, float]:
    """Each kind's mean paired difference (learned minus fixed) over `rows`, in standard errors (-inf
    where it is not above 0 or cannot be told, and for a kind with fewer than MIN_KIND_ITEMS items in
    all: too few to trust the learned choice on)."""
    out = {}
    for kind in {str(k) for k in kinds[rows] if k}:  # "" (unseen kinds) always takes the text-only path
        d = difference[rows][kinds[rows] == kind]
        if len(d) < 2 or d.mean() <= 0 or int((kinds == kind).sum()) < MIN_KIND_ITEMS:
            out[kind] = -math.inf
            continue
        spread = float(d.std(ddof=1))
        out[kind] = math.inf if spread == 0 else float(d.mean() / (spread / math.sqrt(len(d))))
    return out


def _trusts(score: float, z: float) -> bool:
    return math.isfinite(z) and score >= z


def choose_gate_z(
    rewards: np.ndarray, kinds: np.ndarray, learned: np.ndarray, fixed: np.ndarray, fold: np.ndarray
) -> tuple[float, np.ndarray]:
    """The gate's threshold chosen out of fold, and each item's choice under it: each fold is planned by
    the gates the other folds' rows set, for every z of GATE_ZS. (The other folds' choices are out of
    fold, but their policies were trained with this fold among the rest: the gate is cross-validated on
    the choices, not re-nested around their training.)

    The one-standard-error rule (Hastie, Tibshirani and Friedman, The Elements of Statistical Learning,
    7.10): the largest z (the most fallback) whose mean reward is within one standard error of the best
    z's, that standard error read from the best z's fold means. A z that earns more by less than the
    folds disagree is noise, and the fixed workflow is the simpler policy."""
    rows = np.arange(len(kinds))
    difference = rewards[rows, learned] - rewards[rows, fixed]
    folds = np.unique(fold)
    per_fold = {z: np.zeros(len(folds)) for z in GATE_ZS}  # each z's mean reward in each held-out fold
    chosen = {z: fixed.copy() for z in GATE_ZS}
    for n, f in enumerate(folds):
        held, kept = fold == f, fold != f
        scores = _z_scores(difference, kinds, kept)
        for z in GATE_ZS:
            trusted = {k for k, s in scores.items() if _trusts(s, z)} | {""}
            chosen[z][held] = np.where([str(k) in trusted for k in kinds[held]], learned[held], fixed[held])
            per_fold[z][n] = float(rewards[rows[held], chosen[z][held]].mean())
    earned = {z: float(rewards[rows, chosen[z]].mean()) for z in GATE_ZS}
    best = max(earned, key=lambda z: (earned[z], z))
    spread = per_fold[best]
    error = float(spread.std(ddof=1) / math.sqrt(len(spread))) if len(spread) > 1 else 0.0
    z = max(z for z in GATE_ZS if earned[z] >= earned[best] - error - 1e-9)
    return z, chosen[z]


def _gates(
    rewards: np.ndarray,
    kinds: np.ndarray,
    learned: np.ndarray,
    fixed: np.ndarray,
    fixed_all: dict[str, str],
    gate_z: float,
) -> list[KindGate]:
    rows = np.arange(len(kinds))
    scores = _z_scores(rewards[rows, learned] - rewards[rows, fixed], kinds, rows)
    gates = []
    for kind in sorted(scores):
        mask = kinds == kind
        gates.append(
            KindGate(
                kind=kind,
                items=int(mask.sum()),
                learned_reward=round(float(rewards[rows, learned][mask].mean()), 5),
                fixed_reward=round(float(rewards[rows, fixed][mask].mean()), 5),
                fixed_workflow=str(fixed_all[kind]),
                learned=_trusts(scores[kind], gate_z),
                z=round(scores[kind], 3) if math.isfinite(scores[kind]) else scores[kind],
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
    refine: int = REFINE,
    on_fold: Callable[[int, int], None] | None = None,
) -> Fit:
    """Cross-validate the gated policy at every cost penalty, and at up to `refine` more between the
    points furthest apart in cost (see the module's docstring). `make_policy()`: an untrained policy
    over `actions` that knows the items' kinds; `on_fold(done, total)` is called after each training (a
    job's progress; it may raise to stop)."""
    items = list(items)
    template = make_policy()
    table = outcome_table(actions, items, template.scorers)
    kinds = kinds_column(template, items)
    fold = fold_of(items, folds)
    rows = np.arange(len(items))
    points: list[Point] = []
    refine = refine if len(penalties) > 1 else 0
    planned = len(penalties) + refine

    def point(penalty: float) -> Point:
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
                on_fold(len(points) * folds + f + 1, planned * folds)
            per_kind = best_fixed(rewards[kept], kinds[kept])
            overall = int(np.argmax(rewards[kept].mean(axis=0)))
            fixed[held] = [per_kind.get(str(k), overall) for k in kinds[held]]
        fixed_all = best_fixed(rewards, kinds)
        # The point is what the whole procedure earns out of fold: each fold's kinds gated by the other
        # folds (not by gates read off the same rows, which would credit a kind for the win that kept it).
        gate_z, chosen = choose_gate_z(rewards, kinds, learned, fixed, fold)
        # The gates the policy trained on every item gets (gate_policy), from every out-of-fold row.
        gates = _gates(
            rewards, kinds, learned, fixed, {k: actions[i].name for k, i in fixed_all.items()}, gate_z
        )
        return Point(
            cost_penalty_per_usd=float(penalty),
            accuracy=float(table.correct[rows, chosen].mean()),
            usd_per_1000=float(table.cost[rows, chosen].mean() * PER_1000),
            gates=gates,
            gate_z=gate_z,
        )

    for penalty in penalties:
        points.append(point(penalty))
    jumps: set[tuple[float, float]] = set()  # intervals a split did not narrow: not split again
    for _ in range(refine):
        gap = _widest_gap(points, jumps)
        if gap is None:
            break
        low, high, width = gap
        middle = point((low.cost_penalty_per_usd + high.cost_penalty_per_usd) / 2)
        points.append(middle)
        for a, b in ((low, middle), (middle, high)):
            if abs(a.usd_per_1000 - b.usd_per_1000) >= JUMP_SHARE * width:
                jumps.add((a.cost_penalty_per_usd, b.cost_penalty_per_usd))
    points.sort(key=lambda p: p.cost_penalty_per_usd)
    _frontier_mark(points)
    return Fit(points=points, folds=folds, items=len(items), table=table, workflows=[a.name for a in actions])


def _frontier_mark(points: list[Point]) -> None:
    """Mark the points no other dominates (at least as accurate and as cheap, and better on one)."""
    for p in points:
        p.on_frontier = not any(
            dominates(q.accuracy, q.usd_per_1000, p.accuracy, p.usd_per_1000) for q in points
        )


def _widest_gap(points: list[Point], jumps: set[tuple[float, float]]) -> tuple[Point, Point, float] | None:
    """The two neighbouring penalties whose points are furthest apart in cost, and how far, where that is
    more than GAP_USD_PER_1000, the penalties are at least MIN_PENALTY_STEP apart, and the interval is
    not a jump (a split of it left one half with most of the gap: a kind's choice flips at one
    penalty, and halving again would not close it)."""
    ordered = sorted(points, key=lambda p: p.cost_penalty_per_usd)
    gaps = [
        (abs(a.usd_per_1000 - b.usd_per_1000), a.cost_penalty_per_usd, a, b)
        for a, b in pairwise(ordered)
        if b.cost_penalty_per_usd - a.cost_penalty_per_usd >= MIN_PENALTY_STEP
        and (a.cost_penalty_per_usd, b.cost_penalty_per_usd) not in jumps
    ]
    widest = max(gaps, key=lambda g: (g[0], g[1]), default=None)
    if widest is None or widest[0] <= GAP_USD_PER_1000:
        return None
    return widest[2], widest[3], widest[0]


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
