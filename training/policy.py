"""The learned conductor's policy: text features to a distribution over workflows, trained with GRPO.

Small enough to train and run on a CPU in milliseconds. Its actions are workflows in the paper's
format (training.workflows: single, cascade, cross-check, vote), each simulated on a recorded item
to score it.

Training follows GRPO without a KL term: for each item, sample a group of G workflows from the policy,
score each (correct, minus a cost penalty), and push up the log-probability of each sample in
proportion to its group-relative advantage (reward minus the group mean).
Rollouts here are evaluated offline from recorded outcomes of real models (the replay pool); the
same policy plans live tasks through the engine.

The model and GRPO are here; the actions and their simulation are training.workflows (re-exported
here, as the policy's vocabulary), the features training.features, the kinds training.kinds, the
choice of operating point and the per-kind fallback training.frontier.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from .features import DEFAULT_FEATURES, FEATURE_SETS, feature_size, features
from .kinds import LEGACY_KINDS, kinds_of
from .rewards import RewardConfig, reward_of
from .workflows import (
    Outcome,
    Workflow,
    agree,
    answer_key,
    cascade_instruction,
    check_instruction,
    default_actions,
    parse_instruction,
    rule_workflow,
    simulate,
    static_rule_workflows,
    tie_instruction,
    vote_instruction,
)

# The policy's own names, and the workflows' and features' it speaks in (importers name them from here).
__all__ = [
    "DEFAULT_FEATURES",
    "FEATURE_SETS",
    "GRPOConfig",
    "Outcome",
    "POLICY_FORMAT",
    "Policy",
    "Table",
    "Workflow",
    "agree",
    "answer_key",
    "cascade_instruction",
    "check_instruction",
    "default_actions",
    "outcome_table",
    "parse_instruction",
    "reward",
    "rule_workflow",
    "simulate",
    "static_rule_workflows",
    "tie_instruction",
    "train",
    "vote_instruction",
]

# 3: the task kinds (and their scorers) come from the training items and are saved with the weights,
# with the per-kind fallback workflows and the accuracy/cost frontier the policy was chosen from.
# Formats 1 and 2 (no "kinds") were trained on the three benchmark labels of LEGACY_KINDS.
POLICY_FORMAT = 3


@dataclass
class Policy:
    """Weights over the features of (text, kind), one column per workflow.

    `kinds` (with their scorers) are the task labels of the training items; a task of any other kind
    is planned from its text alone. `fallback` names, per kind, the fixed workflow planned instead of
    the learned choice where cross-validation on the training items found the learned one no better
    (training.frontier). `cost_penalty_per_usd` is the operating point it was trained for and
    `frontier` the accuracy/cost curve that point was picked from."""

    actions: list[Workflow]
    weights: np.ndarray = field(repr=False)
    feature_set: str = DEFAULT_FEATURES
    kinds: list[str] = field(default_factory=list)
    scorers: dict[str, str] = field(default_factory=dict)
    fallback: dict[str, int] = field(default_factory=dict)
    cost_penalty_per_usd: float | None = None
    frontier: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def new(
        cls, actions: list[Workflow], feature_set: str = DEFAULT_FEATURES, kinds: dict[str, str] | None = None
    ) -> Policy:
        """An untrained policy; `kinds`: kind -> scorer (training.kinds.kinds_of), none: text only."""
        known = dict(kinds or {})
        size = feature_size(feature_set, list(known))
        return cls(actions, np.zeros((size, len(actions)), dtype=np.float32), feature_set, list(known), known)

    @classmethod
    def for_items(
        cls, actions: list[Workflow], items: list[Any], feature_set: str = DEFAULT_FEATURES, **kinds: Any
    ) -> Policy:
        """An untrained policy that knows the kinds of `items` (kinds_of's `min_items` may be passed)."""
        return cls.new(actions, feature_set, kinds_of(items, **kinds))

    def kind(self, domain: str) -> str:
        """The kind the policy plans a task as: its label if trained on it, else "" (text only)."""
        return domain if domain and domain in self.kinds else ""

    def scorer(self, domain: str) -> str | None:
        return self.scorers.get(domain)

    def featurize(self, text: str, domain: str) -> np.ndarray:
        return features(text, self.kind(domain), self.kinds, self.feature_set)

    def probabilities(self, x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
        nz = np.flatnonzero(x)
        logits = (x[nz] @ self.weights[nz]) / max(temperature, 1e-6)
        logits -= logits.max()
        p = np.exp(logits)
        return p / p.sum()

    def ranked(self, text: str, domain: str) -> tuple[list[int], np.ndarray]:
        """The workflows' indices, most probable first (the kind's fallback first, where it has one),
        and the learned probabilities."""
        p = self.probabilities(self.featurize(text, domain))
        order = [int(i) for i in np.argsort(-p, kind="stable")]
        fixed = self.fallback.get(self.kind(domain))
        if fixed is not None:
            order.remove(fixed)
            order.insert(0, fixed)
        return order, p

    def choose(self, text: str, domain: str) -> tuple[Workflow, list[dict[str, Any]]]:
        """The workflow planned, and the alternatives with their probabilities (the "why")."""
        order, p = self.ranked(text, domain)
        alternatives = [{"workflow": self.actions[i].name, "p": round(float(p[i]), 4)} for i in order[:5]]
        return self.actions[order[0]], alternatives

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": POLICY_FORMAT,
                "features": self.feature_set,
                "kinds": [[k, self.scorers.get(k, "")] for k in self.kinds],
                "fallback": self.fallback,
                "cost_penalty_per_usd": self.cost_penalty_per_usd,
                "frontier": self.frontier,
                "actions": [[a.kind, list(a.workers)] for a in self.actions],
                "weights": self.weights.round(5).tolist(),
            }
        )

    @classmethod
    def from_json(cls, data: str) -> Policy:
        """Reads this format, format 2 and format 1 (no "format" key: v1 features); those two were
        trained on LEGACY_KINDS."""
        raw = json.loads(data)
        feature_set = raw.get("features", "v1")
        if feature_set not in FEATURE_SETS:
            raise ValueError(f"unknown feature set {feature_set!r} in policy")
        pairs = raw["kinds"] if "kinds" in raw else [[k, ""] for k in LEGACY_KINDS]
        kinds = [str(k) for k, _ in pairs]
        actions = [Workflow(k, tuple(w)) for k, w in raw["actions"]]
        weights = np.asarray(raw["weights"], dtype=np.float32)
        if weights.shape != (feature_size(feature_set, kinds), len(actions)):
            raise ValueError(f"policy weights of shape {weights.shape} do not fit its features and workflows")
        fallback = {str(k): int(i) for k, i in (raw.get("fallback") or {}).items()}
        if any(not 0 <= i < len(actions) for i in fallback.values()):
            raise ValueError("a fallback names a workflow the policy does not have")
        penalty = raw.get("cost_penalty_per_usd")
        return cls(
            actions,
            weights,
            feature_set,
            kinds,
            {str(k): str(s) for k, s in pairs if s},
            fallback,
            None if penalty is None else float(penalty),
            raw.get("frontier") or {},
        )


@dataclass
class GRPOConfig:
    group_size: int = 16
    epochs: int = 40
    learning_rate: float = 3.0
    cost_penalty_per_usd: float = 20.0  # reward = correct - penalty * cost of the item in USD
    seed: int = 0
    # How often an item is shown without its kind, so that the text-only path (the kinds the policy
    # never saw) learns from every item too.
    text_only_rate: float = 0.2


def reward(outcome: Outcome, config: GRPOConfig) -> float:
    """training.rewards' formula, with no format term (a workflow of the policy always parses)."""
    weights = RewardConfig(cost_penalty_per_usd=config.cost_penalty_per_usd)
    return reward_of(parsed=True, correct=outcome.correct, cost_usd=outcome.cost_usd, config=weights).reward


@dataclass(frozen=True)
class Table:
    """What every workflow scored (`correct`) and cost in USD (`cost`) on every item: items x workflows."""

    correct: np.ndarray
    cost: np.ndarray

    def rewards(self, cost_penalty_per_usd: float) -> np.ndarray:
        """reward() for every cell (the same formula, at once)."""
        return np.round(self.correct - cost_penalty_per_usd * self.cost, 8)

    def rows(self, index: Any) -> Table:
        return Table(self.correct[index], self.cost[index])


def outcome_table(actions: list[Workflow], items: list[Any], scorers: dict[str, str] | None = None) -> Table:
    """simulate() of every workflow on every item (answers agree by each kind's scorer)."""
    scorers = scorers or {}
    cells = [
        [simulate(a, item.outcomes, item.domain, scorers.get(item.domain)) for a in actions] for item in items
    ]
    return Table(
        np.array([[c.correct for c in row] for row in cells], dtype=np.float64).reshape(len(items), -1),
        np.array([[c.cost_usd for c in row] for row in cells], dtype=np.float64).reshape(len(items), -1),
    )


@lru_cache(maxsize=16384)
def _sparse_features(
    text: str, kind: str, kinds: tuple[str, ...], feature_set: str
) -> tuple[np.ndarray, np.ndarray]:
    """An item's features as (indices, values) of the non-zero ones; cached, because cross-validation
    trains on the same items many times (about 1 KB an item)."""
    x = features(text, kind, list(kinds), feature_set)
    nz = np.flatnonzero(x)
    return nz, x[nz]


def train(
    policy: Policy,
    items: list[Any],
    config: GRPOConfig,
    on_epoch: Callable[[int, float], None] | None = None,
    table: Table | None = None,
) -> list[float]:
    """GRPO over recorded items (each with .task, .domain, .outcomes). Returns the mean reward per epoch;
    `on_epoch(epoch, mean_reward)` is called after each (a training job's progress; it may raise to stop).
    `table`: outcome_table(policy.actions, items, policy.scorers), when the caller has it already."""
    rng = np.random.default_rng(config.seed)
    kinds = tuple(policy.kinds)
    with_kind = [_sparse_features(i.task, policy.kind(i.domain), kinds, policy.feature_set) for i in items]
    text_only = [_sparse_features(i.task, "", kinds, policy.feature_set) for i in items]
    table = table or outcome_table(policy.actions, items, policy.scorers)
    rewards_of = table.rewards(config.cost_penalty_per_usd)
    history = []
    for _ in range(config.epochs):
        order = rng.permutation(len(items))
        hide = rng.random(len(items)) < config.text_only_rate
        total = 0.0
        for index in order:
            nz, values = text_only[index] if hide[index] else with_kind[index]
            logits = values @ policy.weights[nz]
            logits -= logits.max()
            p = np.exp(logits)
            p /= p.sum()
            group = rng.choice(len(policy.actions), size=config.group_size, p=p)
            rewards = rewards_of[index, group].astype(np.float32)
            mean = rewards.sum() / config.group_size
            total += float(mean)
            # Group-relative advantage without dividing by the group's std (as in Dr. GRPO): on items every
            # worker gets right, the std is tiny and dividing by it would blow pennies of cost up into
            # full-size advantages, teaching "always the cheapest" and nothing else.
            advantages = rewards - mean
            if not advantages.any():
                continue  # no signal in a group whose samples all scored the same
            # d log pi(a|x) / d W = x (onehot(a) - p)
            grad = -float(advantages.sum()) * p.astype(np.float32)
            np.add.at(grad, group, advantages)
            policy.weights[nz] += config.learning_rate / config.group_size * np.outer(values, grad)
        history.append(total / len(items))
        if on_epoch is not None:
            on_epoch(len(history), history[-1])
    policy.cost_penalty_per_usd = config.cost_penalty_per_usd
    return history
