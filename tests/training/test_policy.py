"""The learned conductor's policy on a small subset of the replay pool: GRPO raises its reward."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from routing import replay
from training.policy import GRPOConfig, Policy, Workflow, default_actions, reward, simulate, train


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
        [reward(simulate(policy.choose(i.task, i.domain)[0], i.outcomes), config) for i in items]
    )
    uniform = np.mean([reward(simulate(a, i.outcomes), config) for i in items for a in policy.actions])
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
