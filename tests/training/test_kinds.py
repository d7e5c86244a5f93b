"""Task kinds come from the training data (labels and scorers), a kind never seen takes the text-only
path, and the saved policy keeps what it learned of them."""

from __future__ import annotations

import json
from decimal import Decimal
from types import SimpleNamespace

import numpy as np
import pytest

from routing.conductors import PlanRequest, WorkerCard
from training.conductor import LearnedConductor
from training.features import FEATURES, feature_size
from training.kinds import LEGACY_KINDS, kinds_of
from training.policy import GRPOConfig, Policy, Workflow, agree, simulate, train

CHEAP, STRONG = "cheap-model", "strong-model"
ACTIONS = [Workflow("single", (CHEAP,)), Workflow("single", (STRONG,))]


def outcome(score: float, cost: float, answer: str = "18") -> dict:
    return {"score": score, "cost_usd": cost, "answer": answer}


def items(kind: str, n: int, *, cheap_right: bool, scorer: str = "") -> list[SimpleNamespace]:
    """n tasks of `kind` with the same texts as any other kind's: only the label tells them apart."""
    return [
        SimpleNamespace(
            id=f"{kind}-{i}",
            domain=kind,
            task=f"Please handle request number {i} carefully",
            scorer=scorer,
            outcomes={CHEAP: outcome(float(cheap_right), 0.0001), STRONG: outcome(1.0, 0.01)},
        )
        for i in range(n)
    ]


def test_the_kinds_and_their_scorers_come_from_the_training_items():
    data = (
        items("invoices", 30, cheap_right=True, scorer="numeric")
        + items("proofs", 25, cheap_right=False)
        + items("rare", 3, cheap_right=True)
    )
    found = kinds_of(data)
    # Made-up labels, most frequent first; the scorer the items name, else the default for the label;
    # a label with few items is a kind too (training.frontier's gate plans it by its best fixed workflow).
    assert found == {"invoices": "numeric", "proofs": "exact", "rare": "exact"}
    assert kinds_of(items("gsm8k", 20, cheap_right=True)) == {"gsm8k": "numeric"}

    policy = Policy.for_items(ACTIONS, data)
    assert policy.kinds == ["invoices", "proofs", "rare"]
    assert policy.weights.shape == (feature_size("v1", ["invoices", "proofs", "rare"]), 2)
    train(policy, data, GRPOConfig(epochs=25, cost_penalty_per_usd=20, seed=3))
    # The same text routes by its kind: the cheap worker is enough for invoices, not for proofs.
    text = "Please handle request number 99 carefully"
    assert policy.choose(text, "invoices")[0].workers == (CHEAP,)
    assert policy.choose(text, "proofs")[0].workers == (STRONG,)

    saved = Policy.from_json(policy.to_json())
    assert saved.kinds == policy.kinds
    assert saved.scorers == {"invoices": "numeric", "proofs": "exact", "rare": "exact"}
    assert saved.choose(text, "proofs")[0].workers == (STRONG,)


def test_a_kind_never_seen_takes_the_text_only_path():
    data = items("invoices", 30, cheap_right=True) + items("proofs", 30, cheap_right=False)
    policy = Policy.for_items(ACTIONS, data)
    train(policy, data, GRPOConfig(epochs=10, cost_penalty_per_usd=20, seed=1))
    text = "Please handle request number 7 carefully"

    unseen = policy.featurize(text, "receipts")
    assert policy.kind("receipts") == ""
    assert np.array_equal(unseen, policy.featurize(text, ""))  # no kind at all: the same features
    assert not unseen[FEATURES : FEATURES + len(policy.kinds)].any()  # no kind indicator is set
    assert not np.array_equal(unseen, policy.featurize(text, "invoices"))
    chosen, alternatives = policy.choose(text, "receipts")
    assert chosen in ACTIONS and len(alternatives) == 2

    # Through the conductor: a task labelled with a kind the policy never saw gets a valid plan.
    cards = [WorkerCard(slug, "v", "", Decimal("1"), Decimal("1")) for slug in (CHEAP, STRONG)]
    request = PlanRequest(task_text=text, domain="receipts", workers=cards, max_steps=5, may_recurse=True)
    conductor = LearnedConductor.__new__(LearnedConductor)
    conductor.policy = policy
    plan = json.loads(conductor.propose(request).raw_output)
    assert [s["worker"] for s in plan["steps"]] == list(chosen.workers)


def test_the_kind_scorer_decides_when_two_answers_agree():
    # A deployment's kind graded by numbers: "18" and "$18.00" agree; with no scorer known for the label,
    # they are compared as text and do not.
    assert agree("18", "$18.00", "ledger", "numeric")
    assert not agree("18", "$18.00", "ledger")
    assert not agree("18", "$18.00", "ledger", "regex")  # not a symmetric comparison: exact match
    cascade = Workflow("cascade", ("a", "b", "judge"))
    outcomes = {
        "a": outcome(1.0, 0.001, "18"),
        "b": outcome(1.0, 0.001, "$18.00"),
        "judge": outcome(0.0, 0.05),
    }
    assert simulate(cascade, outcomes, "ledger", "numeric").cost_usd == pytest.approx(
        0.002
    )  # agreed: no judge
    assert simulate(cascade, outcomes, "ledger").cost_usd == pytest.approx(0.052)


def test_policies_saved_before_kinds_came_from_data_still_load():
    old = json.dumps(
        {
            "format": 2,
            "features": "v1",
            "actions": [["single", ["a"]], ["single", ["b"]]],
            "weights": np.zeros((feature_size("v1", LEGACY_KINDS), 2)).tolist(),
        }
    )
    policy = Policy.from_json(old)
    assert policy.kinds == LEGACY_KINDS and policy.fallback == {} and policy.scorers == {}
    assert policy.kind("gsm8k") == "gsm8k" and policy.kind("invoices") == ""
    wrong = json.loads(old)
    wrong["weights"] = np.zeros((10, 2)).tolist()
    with pytest.raises(ValueError, match="do not fit"):
        Policy.from_json(json.dumps(wrong))
