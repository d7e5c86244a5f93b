"""The learned conductor's policy: text features to a distribution over workflows, trained with GRPO.

Small enough to train and run on a CPU in milliseconds. Actions are workflows in the paper's format:
one worker, or a cascade through recursion (two cheap workers answer; the conductor, called as the
third step, passes the answer through when they agree and asks a strong worker when they do not).

Training follows GRPO without a KL term: for each item, sample a group of G workflows from the policy,
score each (correct, minus a cost penalty), and push up the log-probability of each sample in
proportion to its group-relative advantage (reward minus the group mean).
Rollouts here are evaluated offline from recorded outcomes of real models (the replay pool); the
same policy plans live tasks through the engine.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FEATURES = 4096  # hashed words and word pairs; plus domain and length features below
DOMAINS = ["gsm8k", "math-l5", "cruxeval-o"]
_WORD = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")


@dataclass(frozen=True)
class Workflow:
    """Single: workers = (w,). Cascade: workers = (a, b, judge)."""

    kind: str  # "single" | "cascade"
    workers: tuple[str, ...]

    @property
    def name(self) -> str:
        if self.kind == "single":
            return self.workers[0]
        a, b, judge = self.workers
        return f"cascade({a}+{b}->{judge})"

    def plan(self, task_text: str) -> dict[str, Any]:
        """The workflow as the conductor writes it (DESIGN.md's format)."""
        if self.kind == "single":
            return {
                "thought": f"one worker: {self.name}",
                "steps": [{"worker": self.workers[0], "instruction": task_text, "access": []}],
            }
        a, b, judge = self.workers
        return {
            "thought": f"two cheap answers; escalate to {judge} only if they disagree",
            "steps": [
                {"worker": a, "instruction": task_text, "access": []},
                {"worker": b, "instruction": task_text, "access": []},
                {
                    "worker": "conductor",
                    "instruction": f"If the two answers agree, pass them through; otherwise ask {judge}.",
                    "access": "all",
                },
            ],
        }


def features(text: str, domain: str) -> np.ndarray:
    x = np.zeros(FEATURES + len(DOMAINS) + 4, dtype=np.float32)
    words = _WORD.findall(text.lower())
    for token in words + [f"{p} {q}" for p, q in zip(words, words[1:], strict=False)]:
        x[int(hashlib.blake2b(token.encode(), digest_size=4).hexdigest(), 16) % FEATURES] = 1.0
    norm = math.sqrt(max(float(x[:FEATURES].sum()), 1.0))
    x[:FEATURES] /= norm
    if domain in DOMAINS:
        x[FEATURES + DOMAINS.index(domain)] = 1.0
    length = len(text)
    x[FEATURES + len(DOMAINS) :] = [length < 200, 200 <= length < 500, 500 <= length < 1000, length >= 1000]
    return x


@dataclass
class Outcome:
    correct: float
    cost_usd: float


def answer_key(answer: str) -> str:
    return re.sub(r"\s+", "", str(answer)).strip().lower().rstrip(".")


def simulate(workflow: Workflow, outcomes: dict[str, dict[str, Any]]) -> Outcome:
    """What a workflow would have scored and cost on one recorded item."""
    if workflow.kind == "single":
        o = outcomes[workflow.workers[0]]
        return Outcome(float(o["score"]), float(o["cost_usd"]))
    a, b, judge = (outcomes[w] for w in workflow.workers)
    cost = float(a["cost_usd"]) + float(b["cost_usd"])
    if answer_key(a["answer"]) == answer_key(b["answer"]) and answer_key(a["answer"]):
        return Outcome(float(a["score"]), cost)
    return Outcome(float(judge["score"]), cost + float(judge["cost_usd"]))


def default_actions(models: list[str]) -> list[Workflow]:
    actions = [Workflow("single", (m,)) for m in models]
    cheap = [
        m
        for m in (
            "gpt-4o-mini-2024-07-18",
            "gemini-1.5-flash",
            "Qwen2-72B-Instruct",
            "Meta-Llama-3.1-70B-Instruct",
        )
        if m in models
    ]
    judges = [m for m in ("gpt-4o-2024-08-06", "claude-3-5-sonnet-20240620") if m in models]
    for i, a in enumerate(cheap):
        for b in cheap[i + 1 :]:
            for judge in judges:
                actions.append(Workflow("cascade", (a, b, judge)))
    return actions


@dataclass
class Policy:
    actions: list[Workflow]
    weights: np.ndarray = field(repr=False)

    @classmethod
    def new(cls, actions: list[Workflow]) -> Policy:
        return cls(actions, np.zeros((FEATURES + len(DOMAINS) + 4, len(actions)), dtype=np.float32))

    def probabilities(self, x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
        logits = (x @ self.weights) / max(temperature, 1e-6)
        logits -= logits.max()
        p = np.exp(logits)
        return p / p.sum()

    def choose(self, text: str, domain: str) -> tuple[Workflow, list[dict[str, Any]]]:
        """The most probable workflow, and the alternatives with their probabilities (the "why")."""
        p = self.probabilities(features(text, domain))
        order = np.argsort(-p)
        alternatives = [{"workflow": self.actions[i].name, "p": round(float(p[i]), 4)} for i in order[:5]]
        return self.actions[int(order[0])], alternatives

    def to_json(self) -> str:
        return json.dumps(
            {
                "actions": [[a.kind, list(a.workers)] for a in self.actions],
                "weights": self.weights.round(6).tolist(),
            }
        )

    @classmethod
    def from_json(cls, data: str) -> Policy:
        raw = json.loads(data)
        return cls(
            [Workflow(k, tuple(w)) for k, w in raw["actions"]], np.asarray(raw["weights"], dtype=np.float32)
        )


@dataclass
class GRPOConfig:
    group_size: int = 16
    epochs: int = 40
    learning_rate: float = 3.0
    cost_penalty_per_usd: float = 20.0  # reward = correct - penalty * cost of the item in USD
    seed: int = 0


def reward(outcome: Outcome, config: GRPOConfig) -> float:
    return outcome.correct - config.cost_penalty_per_usd * outcome.cost_usd


def train(policy: Policy, items: list[Any], config: GRPOConfig) -> list[float]:
    """GRPO over recorded items (each with .task, .domain, .outcomes). Returns the mean reward per epoch."""
    rng = np.random.default_rng(config.seed)
    xs = [features(item.task, item.domain) for item in items]
    table = [[reward(simulate(a, item.outcomes), config) for a in policy.actions] for item in items]
    history = []
    for _ in range(config.epochs):
        order = rng.permutation(len(items))
        total = 0.0
        for index in order:
            x = xs[index]
            p = policy.probabilities(x)
            group = rng.choice(len(policy.actions), size=config.group_size, p=p)
            rewards = np.array([table[index][a] for a in group], dtype=np.float32)
            total += float(rewards.mean())
            # Group-relative advantage without dividing by the group's std (as in Dr. GRPO): on items every
            # worker gets right, the std is tiny and dividing by it would blow pennies of cost up into
            # full-size advantages, teaching "always the cheapest" and nothing else.
            advantages = rewards - rewards.mean()
            if not advantages.any():
                continue  # no signal in a group whose samples all scored the same
            # d log pi(a|x) / d W = x (onehot(a) - p)
            grad = np.zeros(len(policy.actions), dtype=np.float32)
            for a, adv in zip(group, advantages, strict=True):
                grad -= adv * p
                grad[a] += adv
            policy.weights += config.learning_rate / config.group_size * np.outer(x, grad)
        history.append(total / len(items))
    return history
