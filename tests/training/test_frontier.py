"""The frontier: cost penalties cross-validated on the training items, the per-kind fallback where the
learned choice does not beat the kind's best fixed workflow, and no fixed workflow above the curve."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from types import SimpleNamespace

import numpy as np

from routing.conductors import PlanRequest, WorkerCard
from training.conductor import LearnedConductor
from training.frontier import (
    GATE_ZS,
    _gates,
    best_fixed,
    choose_gate_z,
    dominates,
    fold_of,
    gate_policy,
    sweep,
)
from training.policy import GRPOConfig, Policy, Workflow, outcome_table, train

CHEAP, MID, STRONG = "cheap", "mid", "strong"
ACTIONS = [Workflow("single", (w,)) for w in (CHEAP, MID, STRONG)]
CONFIG = GRPOConfig(epochs=12, seed=2)


def item(kind: str, i: int, text: str, right: tuple[bool, bool, bool]) -> SimpleNamespace:
    costs = (0.0001, 0.002, 0.01)
    return SimpleNamespace(
        id=f"{kind}-{i}",
        domain=kind,
        task=text,
        outcomes={
            w: {"score": float(r), "cost_usd": c, "answer": "x"}
            for w, r, c in zip((CHEAP, MID, STRONG), right, costs, strict=True)
        },
    )


def plain_items() -> list[SimpleNamespace]:
    """Two kinds whose texts say nothing: "chat" is answered by every worker, "math" by mid and strong."""
    return [item("chat", i, f"request {i}", (True, True, True)) for i in range(24)] + [
        item("math", i, f"request {i}", (False, True, True)) for i in range(24)
    ]


def mixed_items() -> list[SimpleNamespace]:
    """One kind whose text tells the worker needed: "easy" items the cheap one answers, "hard" ones only
    the strong one."""
    return [
        item(
            "support",
            i,
            f"{'easy' if i % 2 else 'hard'} question about order {i}",
            (bool(i % 2), False, True),
        )
        for i in range(48)
    ]


def make(items):
    return lambda: Policy.for_items(ACTIONS, items)


def test_where_the_text_says_nothing_each_kind_falls_back_to_its_best_fixed_workflow(tmp_path):
    data = plain_items()
    fit = sweep(ACTIONS, data, make(data), CONFIG, penalties=[20.0], folds=3)
    (point,) = fit.points
    assert {g.kind: g.learned for g in point.gates} == {"chat": False, "math": False}
    policy = make(data)()
    train(policy, data, GRPOConfig(epochs=12, seed=2, cost_penalty_per_usd=20.0), table=fit.table)
    gate_policy(policy, data, fit)
    assert policy.fallback == {"chat": 0, "math": 1}  # cheap for chat, mid for math
    assert policy.choose("anything at all", "chat")[0].workers == (CHEAP,)
    assert policy.choose("anything at all", "math")[0].workers == (MID,)
    assert Policy.from_json(policy.to_json()).fallback == policy.fallback
    # The conductor says so in its plan's thought (the "why" an auditor reads).
    path = tmp_path / "policy.json"
    path.write_text(policy.to_json())
    cards = [WorkerCard(w, "v", "", Decimal("1"), Decimal("1")) for w in (CHEAP, MID, STRONG)]
    request = PlanRequest(task_text="anything", domain="math", workers=cards, max_steps=5, may_recurse=True)
    plan = json.loads(LearnedConductor({"policy_path": str(path)}).propose(request).raw_output)
    assert plan["steps"][0]["worker"] == MID and "the best fixed workflow for kind math" in plan["thought"]
    assert policy.frontier["chosen"] == 20.0 and policy.frontier["points"][0]["on_frontier"]


def test_where_the_text_tells_the_learned_choice_is_kept_and_beats_the_fixed_one():
    data = mixed_items()
    config = GRPOConfig(epochs=30, seed=2)
    fit = sweep(ACTIONS, data, make(data), config, penalties=[20.0], folds=3)
    (gate,) = fit.points[0].gates
    assert gate.kind == "support" and gate.learned
    assert gate.learned_reward > gate.fixed_reward
    assert gate.fixed_workflow == STRONG  # the one fixed workflow right on every item
    # Out of fold, as accurate as the strong worker for less.
    assert fit.points[0].accuracy == 1.0 and fit.points[0].usd_per_1000 < 10.0


def test_no_fixed_workflow_lies_above_the_frontier_on_the_training_items():
    data = plain_items() + mixed_items()
    fit = sweep(ACTIONS, data, make(data), CONFIG, penalties=[0.0, 20.0, 200.0, 5000.0], folds=3)
    frontier = fit.frontier
    assert frontier and all(
        not dominates(q.accuracy, q.usd_per_1000, p.accuracy, p.usd_per_1000)
        for p in frontier
        for q in fit.points
    )
    table = outcome_table(ACTIONS, data)
    for index, action in enumerate(ACTIONS):
        accuracy, cost = table.correct[:, index].mean(), table.cost[:, index].mean() * 1000
        within = [p for p in frontier if p.usd_per_1000 <= cost + 1e-9]
        assert within and max(p.accuracy for p in within) >= accuracy, (action.name, accuracy, cost)


def test_folds_are_stable_and_the_best_fixed_workflow_is_per_kind():
    data = plain_items()
    assert np.array_equal(fold_of(data, 5), fold_of(list(reversed(data)), 5)[::-1])
    rewards = outcome_table(ACTIONS, data).rewards(20.0)
    kinds = np.array([i.domain for i in data], dtype=object)
    assert best_fixed(rewards, kinds) == {"chat": 0, "math": 1}


def gate_case(learned_rewards) -> tuple[np.ndarray, ...]:
    """60 items of one kind in 3 folds; the fixed workflow (0) earns 0.5 on each, the learned one (1)
    `learned_rewards`."""
    n = 60
    rewards = np.zeros((n, 2))
    rewards[:, 0] = 0.5
    rewards[:, 1] = learned_rewards
    kinds = np.array(["a"] * n, dtype=object)
    return rewards, kinds, np.ones(n, dtype=int), np.zeros(n, dtype=int), np.arange(n) % 3


def test_the_gate_threshold_is_chosen_by_cross_validation_on_the_training_items():
    """Each fold is planned by the gates the other folds set, for every z; the z that earns most wins,
    the larger one on a tie; the choices returned are that z's, fold by fold."""
    # Right on 12 of each fold's 20 items, wrong on 8. A weak real edge: +0.1 a task, 1.27 standard
    # errors over two folds. Trusting it earns 12 a fold against the fixed one's 10.
    rewards, kinds, learned, fixed, fold = gate_case([1.0 if (i // 3) % 5 < 3 else 0.0 for i in range(60)])
    assert all(rewards[fold == f, 1].sum() == 12 for f in range(3))
    z, chosen = choose_gate_z(rewards, kinds, learned, fixed, fold)
    assert z == 1.0 and (chosen == learned).all()
    # Better on every item: every finite z trusts it; the largest wins the tie.
    rewards, kinds, learned, fixed, fold = gate_case(1.0)
    z, chosen = choose_gate_z(rewards, kinds, learned, fixed, fold)
    assert z == max(z for z in GATE_ZS if z < math.inf) and (chosen == learned).all()
    # Right only in fold 0: from the other folds it never looks better, so no z trusts it.
    rewards, kinds, learned, fixed, fold = gate_case(np.where(np.arange(60) % 3 == 0, 1.0, 0.0))
    z, chosen = choose_gate_z(rewards, kinds, learned, fixed, fold)
    assert z == math.inf and (chosen == fixed).all()


def test_a_threshold_that_earns_more_by_less_than_the_folds_disagree_falls_back():
    """The one-standard-error rule: trusting the learned choice earns a little more out of fold (+0.05 a
    task), but the folds' means spread by more than that, so the largest z within one standard error of
    the best, "never", wins; with the same edge and folds that agree, the edge is kept."""
    # Fold means of the fixed workflow: 0.2, 0.5 and 0.8 (folds disagree); the learned one 0.05 above
    # in every fold.
    n = 60
    fold = np.arange(n) % 3
    base = np.array([0.2, 0.5, 0.8])[fold]
    rewards = np.stack([base, base + 0.05], axis=1)
    kinds = np.array(["a"] * n, dtype=object)
    learned, fixed = np.ones(n, dtype=int), np.zeros(n, dtype=int)
    # Every item better by the same amount: the paired difference is certain (z = inf), every finite z
    # trusts it, and it earns 0.05 more than "never" -- less than the best z's fold means' standard error.
    z, chosen = choose_gate_z(rewards, kinds, learned, fixed, fold)
    assert z == math.inf and (chosen == fixed).all()
    # The same edge where the folds agree (every fold's mean 0.5): kept.
    rewards = np.stack([np.full(n, 0.5), np.full(n, 0.55)], axis=1)
    z, chosen = choose_gate_z(rewards, kinds, learned, fixed, fold)
    assert z < math.inf and (chosen == learned).all()


def test_the_point_is_the_nested_gate_not_the_gate_read_off_the_same_rows():
    """Far better in fold 0, a little worse in the others: over all the rows the learned choice looks
    better by 2.7 standard errors, and a gate read off them would keep it and credit the point with the
    win. Gated by the other folds, fold 0 falls back (folds 1 and 2 say worse) and folds 1 and 2 keep
    it (fold 0 says better) and lose: every z loses to "never", which the point reports."""
    rewards, kinds, learned, fixed, fold = gate_case(np.where(np.arange(60) % 3 == 0, 1.5, 0.3))
    everywhere = _gates(rewards, kinds, learned, fixed, {"a": "fixed"}, 2.326)
    assert everywhere[0].learned and everywhere[0].z > 2.326
    z, chosen = choose_gate_z(rewards, kinds, learned, fixed, fold)
    assert z == math.inf and (chosen == fixed).all()


def test_the_sweep_fills_the_widest_gap_in_cost_with_a_penalty_between():
    data = plain_items() + mixed_items()
    fit = sweep(ACTIONS, data, make(data), CONFIG, penalties=[0.0, 5000.0], folds=3, refine=2)
    penalties = [p.cost_penalty_per_usd for p in fit.points]
    # 0 costs 5.5 per 1,000 tasks and 5000 0.1: 2500 goes between them and costs 0.1 too. The gap is
    # all between 0 and 2500 (a jump: the choice flips at once), so it is not split again.
    assert penalties == [0.0, 2500.0, 5000.0]
    assert fit.points[1].usd_per_1000 == fit.points[2].usd_per_1000 < 1 < fit.points[0].usd_per_1000
    # The summary keeps each point's gate; "never" (inf) is saved as None, which JSON can hold.
    assert [p["gate_z"] for p in fit.summary()["points"]] == [
        None if math.isinf(p.gate_z) else p.gate_z for p in fit.points
    ]
    json.dumps(fit.summary(), allow_nan=False)
    # Without refinement, only the grid.
    fit = sweep(ACTIONS, data, make(data), CONFIG, penalties=[0.0, 5000.0], folds=3, refine=0)
    assert [p.cost_penalty_per_usd for p in fit.points] == [0.0, 5000.0]
