"""The learned conductor's policy on a small subset of the replay pool: GRPO raises its reward."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from routing import replay
from routing.static_rules import DEFAULT_STATIC_RULES
from training.features import FEATURE_SIZES, feature_size
from training.policy import (
    GRPOConfig,
    Policy,
    Workflow,
    agree,
    default_actions,
    parse_instruction,
    reward,
    simulate,
    static_rule_workflows,
    tie_instruction,
    train,
)


@pytest.fixture(scope="module")
def items():
    return replay.read_items(replay.split_path("train"))[:150]


def test_grpo_raises_the_mean_reward_over_training(items):
    policy = Policy.new(default_actions(sorted(items[0].outcomes)))
    curve = train(policy, items, GRPOConfig(epochs=12, seed=1))
    assert curve[-1] > curve[0] + 0.02, curve
    # Its greedy choices earn more than picking workflows uniformly at random.
    config = GRPOConfig()
    greedy = np.mean(
        [reward(simulate(policy.choose(i.task, i.domain)[0], i.outcomes, i.domain), config) for i in items]
    )
    uniform = np.mean(
        [reward(simulate(a, i.outcomes, i.domain), config) for i in items for a in policy.actions]
    )
    assert greedy > uniform + 0.05, (greedy, uniform)


def test_a_cascade_pays_for_the_judge_only_when_the_cheap_answers_disagree():
    outcomes = {
        "a": {"score": 1.0, "cost_usd": 0.001, "answer": "42"},
        "b": {"score": 1.0, "cost_usd": 0.002, "answer": " 42 "},
        "j": {"score": 0.0, "cost_usd": 0.05, "answer": "41"},
    }
    cascade = Workflow("cascade", ("a", "b", "j"))
    agreed = simulate(cascade, outcomes)
    assert (agreed.correct, agreed.cost_usd) == (1.0, pytest.approx(0.003))
    outcomes["b"] = {"score": 0.0, "cost_usd": 0.002, "answer": "40"}
    escalated = simulate(cascade, outcomes)
    assert (escalated.correct, escalated.cost_usd) == (0.0, pytest.approx(0.053))
    plan = cascade.plan("What is 6 * 7?")
    assert [s["worker"] for s in plan["steps"]] == ["a", "b", "conductor"]
    assert plan["steps"][2]["access"] == "all"


def test_the_static_rules_are_arms_the_policy_may_choose(items):
    """Every rule of the static conductor is a workflow of the learned policy, planned in the same steps,
    so that choosing what the rules would is always open to it (its per-kind fallback included)."""
    rules = {rule["name"]: rule for rule in DEFAULT_STATIC_RULES["rules"]}
    workflows = static_rule_workflows()
    assert workflows == {
        "math-l5": Workflow("check", ("gpt-4o-mini-2024-07-18", "gemini-1.5-flash", "gpt-4o-2024-08-06")),
        "cruxeval-o": Workflow("single", ("gpt-4o-2024-08-06",)),
        "": Workflow("single", ("gpt-4o-mini-2024-07-18",)),
    }
    actions = default_actions(sorted(items[0].outcomes))
    assert set(workflows.values()) <= set(actions)
    task = "Find x."
    written = workflows["math-l5"].plan(task)["steps"]
    ruled = [
        {**step, "instruction": step["instruction"].replace("{task}", task)}
        for step in rules["hard-math-cross-check"]["steps"]
    ]
    assert written == ruled
    assert not workflows["math-l5"].needs_recursion
    # The checker always answers, and is always paid for.
    outcomes = {
        "a": {"score": 1.0, "cost_usd": 0.001, "answer": "42"},
        "b": {"score": 1.0, "cost_usd": 0.002, "answer": "42"},
        "j": {"score": 0.0, "cost_usd": 0.05, "answer": "41"},
    }
    checked = simulate(Workflow("check", ("a", "b", "j")), outcomes)
    assert (checked.correct, checked.cost_usd) == (0.0, pytest.approx(0.053))


def test_a_policy_survives_a_round_trip_and_explains_its_choice():
    actions = [Workflow("single", ("a",)), Workflow("single", ("b",))]
    item = SimpleNamespace(
        task="add two numbers",
        domain="gsm8k",
        outcomes={
            "a": {"score": 1.0, "cost_usd": 0.0, "answer": "1"},
            "b": {"score": 0.0, "cost_usd": 0.0, "answer": "2"},
        },
    )
    policy = Policy.new(actions)
    train(policy, [item] * 10, GRPOConfig(epochs=5, learning_rate=0.5))
    restored = Policy.from_json(policy.to_json())
    choice, alternatives = restored.choose("add two numbers", "gsm8k")
    assert choice.name == "a"
    assert alternatives[0]["workflow"] == "a" and alternatives[0]["p"] > 0.9


def test_answers_agree_by_their_domain_scorer():
    assert agree("18", "$18.00", "gsm8k")
    assert agree("{'1': 'b'}", "{'1':'b'}", "cruxeval-o")
    assert not agree("18", "19", "gsm8k")
    assert not agree("", "", "gsm8k")


def test_a_vote_asks_the_tie_breaker_and_the_judge_only_when_needed():
    outcomes = {
        "a": {"score": 1.0, "cost_usd": 0.001, "answer": "42"},
        "b": {"score": 0.0, "cost_usd": 0.002, "answer": "40"},
        "t": {"score": 1.0, "cost_usd": 0.01, "answer": "42.0"},
        "j": {"score": 0.0, "cost_usd": 0.05, "answer": "41"},
    }
    vote = Workflow("vote", ("a", "b", "t", "j"))
    sided = simulate(vote, outcomes, "gsm8k")  # the tie-breaker sides with a: its answer passes through
    assert (sided.correct, sided.cost_usd) == (1.0, pytest.approx(0.013))
    outcomes["t"] = {"score": 0.0, "cost_usd": 0.01, "answer": "7"}
    judged = simulate(vote, outcomes, "gsm8k")
    assert (judged.correct, judged.cost_usd) == (0.0, pytest.approx(0.063))
    outcomes["b"] = {"score": 1.0, "cost_usd": 0.002, "answer": "42"}
    agreed = simulate(vote, outcomes, "gsm8k")
    assert (agreed.correct, agreed.cost_usd) == (1.0, pytest.approx(0.003))
    steps = vote.plan("What is 6 * 7?")["steps"]
    assert [s["worker"] for s in steps] == ["a", "b", "conductor"]
    assert parse_instruction(steps[2]["instruction"]) == {"kind": "vote", "tie_breaker": "t", "judge": "j"}
    tie = parse_instruction(tie_instruction("gemini-1.5-pro", ["42", 'say "hi"']))
    assert tie == {"kind": "tie", "judge": "gemini-1.5-pro", "earlier": ["42", 'say "hi"']}
    cascade = Workflow("cascade", ("a", "b", "gpt-4o-2024-08-06")).plan("x")["steps"][2]["instruction"]
    assert parse_instruction(cascade) == {"kind": "cascade", "judge": "gpt-4o-2024-08-06"}


def test_a_policy_of_the_first_format_still_loads():
    old = json.dumps(
        {
            "actions": [["single", ["a"]], ["cascade", ["a", "b", "c"]]],
            "weights": np.zeros((FEATURE_SIZES["v1"], 2)).tolist(),
        }
    )
    policy = Policy.from_json(old)
    assert policy.feature_set == "v1" and policy.actions[1].workers == ("a", "b", "c")
    richer = Policy.new(policy.actions, "v2")
    assert Policy.from_json(richer.to_json()).weights.shape == (feature_size("v2", []), 2)
    assert richer.choose("add 2 and 3", "gsm8k")[0] == policy.actions[0]
