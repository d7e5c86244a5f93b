"""The learned conductor's policy: text features to a distribution over workflows, trained with GRPO.

Small enough to train and run on a CPU in milliseconds. Actions are workflows in the paper's format:

- single: one worker answers;
- cascade: two cheap workers answer; the conductor, called as the third step, passes the answer through
  when they agree and asks a judge when they do not;
- cross-check: two workers answer and a third always checks their work and gives the answer (the static
  conductor's rule for hard math, offered so that choosing the rules is always open to the policy);
- vote: like a cascade, but on disagreement the conductor first asks a tie-breaker (a third worker):
  if its answer agrees with one of the two earlier answers it is the majority answer and passes through
  (the inner plan's own conductor step does that check), else a judge is asked. A majority vote of
  three that stops as soon as the outcome is decided, written so the answer passed through is always
  the last response (the engine passes the last response through).

Answers "agree" when their domain's scorer says each matches the other (numbers compare as numbers,
Python literals as values), so "18" and "$18.00" agree. simulate() and the live conductor step
(training.conductor.LearnedConductor) use the same test.

Training follows GRPO without a KL term: for each item, sample a group of G workflows from the policy,
score each (correct, minus a cost penalty), and push up the log-probability of each sample in
proportion to its group-relative advantage (reward minus the group mean).
Rollouts here are evaluated offline from recorded outcomes of real models (the replay pool); the
same policy plans live tasks through the engine.

Why one module of about 450 lines: actions, the model, simulation and GRPO are one algorithm whose
parts change together. The features are training.features, the kinds training.kinds, the choice of
operating point and the per-kind fallback training.frontier.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from routing.scoring.scorers import SCORERS, scorer_name
from routing.static_rules import CROSS_CHECK_INSTRUCTION, DEFAULT_STATIC_RULES

from .features import DEFAULT_FEATURES, FEATURE_SETS, feature_size, features
from .kinds import LEGACY_KINDS, agreement_scorer, kinds_of
from .rewards import RewardConfig, reward_of

# 3: the task kinds (and their scorers) come from the training items and are saved with the weights,
# with the per-kind fallback workflows and the accuracy/cost frontier the policy was chosen from.
# Formats 1 and 2 (no "kinds") were trained on the three benchmark labels of LEGACY_KINDS.
POLICY_FORMAT = 3


@dataclass(frozen=True)
class Workflow:
    """Single: workers = (w,). Cascade and cross-check: (a, b, judge). Vote: (a, b, tie_breaker, judge)."""

    kind: str  # "single" | "cascade" | "check" | "vote"
    workers: tuple[str, ...]

    @property
    def name(self) -> str:
        if self.kind == "single":
            return self.workers[0]
        if self.kind == "vote":
            a, b, tie, judge = self.workers
            return f"vote({a}+{b}->{tie}->{judge})"
        a, b, judge = self.workers
        if self.kind == "check":
            return f"cross-check({a}+{b}=>{judge})"
        return f"cascade({a}+{b}->{judge})"

    @property
    def needs_recursion(self) -> bool:
        return self.kind not in ("single", "check")

    def plan(self, task_text: str) -> dict[str, Any]:
        """The workflow as the conductor writes it (DESIGN.md's format)."""
        if self.kind == "single":
            return {
                "thought": f"one worker: {self.name}",
                "steps": [{"worker": self.workers[0], "instruction": task_text, "access": []}],
            }
        a, b = self.workers[:2]
        if self.kind == "check":
            return {
                "thought": f"two answers; {self.workers[2]} checks them and answers",
                "steps": [
                    {"worker": a, "instruction": task_text, "access": []},
                    {"worker": b, "instruction": task_text, "access": []},
                    {"worker": self.workers[2], "instruction": check_instruction(task_text), "access": "all"},
                ],
            }
        if self.kind == "vote":
            thought = f"two cheap answers; on disagreement {self.workers[2]} breaks the tie, {self.workers[3]} judges"
            instruction = vote_instruction(self.workers[2], self.workers[3])
        else:
            thought = f"two cheap answers; escalate to {self.workers[2]} only if they disagree"
            instruction = cascade_instruction(self.workers[2])
        return {
            "thought": thought,
            "steps": [
                {"worker": a, "instruction": task_text, "access": []},
                {"worker": b, "instruction": task_text, "access": []},
                {"worker": "conductor", "instruction": instruction, "access": "all"},
            ],
        }


# --- the conductor step's instructions: written by the plan, read back by the inner (recursive) call ---


def check_instruction(task_text: str) -> str:
    """The checking step of a cross-check: the static conductor's words (its hard-math rule)."""
    return CROSS_CHECK_INSTRUCTION.replace("{task}", task_text)


def cascade_instruction(judge: str) -> str:
    return f"If the two answers agree, pass them through; otherwise ask {judge}."


def vote_instruction(tie_breaker: str, judge: str) -> str:
    return (
        f"If the two answers agree, pass them through; otherwise ask {tie_breaker} to break the tie, "
        f"then {judge} if it agrees with neither."
    )


def tie_instruction(judge: str, earlier: list[str]) -> str:
    """The inner plan's conductor step: pass the tie-breaker's answer through if it matches an earlier one."""
    return (
        f"If this answer agrees with one of the earlier answers, pass it through; otherwise ask {judge}. "
        f"Earlier answers: {json.dumps(earlier)}"
    )


_VOTE = re.compile(r"otherwise ask ([\w.\-]+) to break the tie, then ([\w.\-]+) if it agrees with neither")
_JUDGE = re.compile(r"otherwise ask ([\w.\-]+)\.")
_EARLIER = re.compile(r"Earlier answers: (\[.*\])\s*$", re.DOTALL)


def parse_instruction(instruction: str) -> dict[str, Any]:
    """What a conductor step written by Workflow.plan (or by the inner call) asks for.

    {"kind": "vote", "tie_breaker", "judge"} | {"kind": "tie", "judge", "earlier"} |
    {"kind": "cascade", "judge"} | {"kind": "unknown"}.
    """
    found = _VOTE.search(instruction)
    if found:
        return {"kind": "vote", "tie_breaker": found.group(1), "judge": found.group(2)}
    judge = _JUDGE.search(instruction)
    earlier = _EARLIER.search(instruction)
    if judge and earlier:
        try:
            answers = [str(a) for a in json.loads(earlier.group(1))]
        except (json.JSONDecodeError, TypeError):
            answers = []
        return {"kind": "tie", "judge": judge.group(1), "earlier": answers}
    if judge:
        return {"kind": "cascade", "judge": judge.group(1)}
    return {"kind": "unknown"}


# --- outcomes ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    correct: float
    cost_usd: float


def answer_key(answer: str) -> str:
    return re.sub(r"\s+", "", str(answer)).strip().lower().rstrip(".")


def agree(a: str, b: str, domain: str = "", scorer: str | None = None) -> bool:
    """Do two extracted answers say the same thing? Keys match, or the kind's scorer (`scorer`, else
    the default for the label `domain`) accepts each as the other's reference (non-empty answers only)."""

    key = answer_key(a)
    if not key:
        return False
    if key == answer_key(b):
        return True
    if not answer_key(b) or len(a) > 2000 or len(b) > 2000:
        return False
    compare = SCORERS[agreement_scorer(scorer or scorer_name("auto", domain))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return compare(str(a), str(b)) == 1.0 and compare(str(b), str(a)) == 1.0
        except Exception:  # noqa: BLE001 - a scorer choking on odd text means "no agreement"
            return False


def simulate(
    workflow: Workflow, outcomes: dict[str, dict[str, Any]], domain: str = "", scorer: str | None = None
) -> Outcome:
    """What a workflow would have scored and cost on one recorded item (as the engine runs it);
    answers agree by `scorer` (else the default for `domain`)."""
    if workflow.kind == "single":
        o = outcomes[workflow.workers[0]]
        return Outcome(float(o["score"]), float(o["cost_usd"]))
    a, b = outcomes[workflow.workers[0]], outcomes[workflow.workers[1]]
    cost = float(a["cost_usd"]) + float(b["cost_usd"])
    if workflow.kind == "check":  # the checker always answers
        judge = outcomes[workflow.workers[-1]]
        return Outcome(float(judge["score"]), cost + float(judge["cost_usd"]))
    if agree(a["answer"], b["answer"], domain, scorer):
        return Outcome(float(b["score"]), cost)  # the last response passes through
    if workflow.kind == "vote":
        tie = outcomes[workflow.workers[2]]
        cost += float(tie["cost_usd"])
        if agree(tie["answer"], a["answer"], domain, scorer) or agree(
            tie["answer"], b["answer"], domain, scorer
        ):
            return Outcome(float(tie["score"]), cost)
    judge = outcomes[workflow.workers[-1]]
    return Outcome(float(judge["score"]), cost + float(judge["cost_usd"]))


MINI, FLASH, QWEN, LLAMA70, HAIKU = (
    "gpt-4o-mini-2024-07-18",
    "gemini-1.5-flash",
    "Qwen2-72B-Instruct",
    "Meta-Llama-3.1-70B-Instruct",
    "claude-3-haiku-20240307",
)
GPT4O, SONNET, PRO = "gpt-4o-2024-08-06", "claude-3-5-sonnet-20240620", "gemini-1.5-pro"


def rule_workflow(steps: list[dict[str, Any]]) -> Workflow | None:
    """The workflow a static rule's steps are, where they are one: one step (single), or two answers
    and a third step that sees them and answers (cross-check)."""
    workers = tuple(step["worker"] for step in steps)
    if len(steps) == 1:
        return Workflow("single", workers)
    if len(steps) == 3 and [s["access"] for s in steps] == [[], [], "all"]:
        return Workflow("check", workers)
    return None


def static_rule_workflows(rules: dict[str, Any] = DEFAULT_STATIC_RULES) -> dict[str, Workflow]:
    """The static conductor's rules as workflows: each rule's domains (and "" for a rule with no
    condition, the default) to its workflow; the first rule for a domain wins, as the conductor tries them."""
    chosen: dict[str, Workflow] = {}
    for rule in rules["rules"]:
        workflow = rule_workflow(rule["steps"])
        if workflow is not None:
            for domain in (rule.get("when") or {}).get("domain") or [""]:
                chosen.setdefault(domain, workflow)
    return chosen


def default_actions(models: list[str]) -> list[Workflow]:
    """Every single model, cascades of two cheap workers with a strong judge, votes whose tie-breaker
    and judge come from the pool's strongest (chosen offline on the train split: the workflows on each
    domain's accuracy/cost frontier), and the static conductor's rules, so that the policy may always
    choose what the rules would."""
    actions = [Workflow("single", (m,)) for m in models]
    cheap = [m for m in (MINI, FLASH, QWEN, LLAMA70) if m in models]
    judges = [m for m in (GPT4O, SONNET) if m in models]
    for i, a in enumerate(cheap):
        for b in cheap[i + 1 :]:
            for judge in judges:
                actions.append(Workflow("cascade", (a, b, judge)))
    votes = [
        (MINI, QWEN, GPT4O, SONNET),
        (MINI, QWEN, SONNET, GPT4O),
        (MINI, LLAMA70, SONNET, GPT4O),
        (MINI, HAIKU, GPT4O, SONNET),
        (MINI, QWEN, HAIKU, SONNET),
        (MINI, QWEN, HAIKU, GPT4O),
        (MINI, FLASH, QWEN, GPT4O),
        (MINI, FLASH, QWEN, PRO),
        (FLASH, QWEN, MINI, GPT4O),
        (FLASH, LLAMA70, PRO, MINI),
    ]
    for workers in votes:
        if all(w in models for w in workers):
            actions.append(Workflow("vote", workers))
    for workflow in static_rule_workflows().values():
        if workflow not in actions and all(w in models for w in workflow.workers):
            actions.append(workflow)
    return actions


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
