"""Rewards for GRPO: what a run earned, as the ML staff configure it.

reward = correctness x term - cost_penalty_per_usd x cost of the run (USD)

where the term is the run's score (1 right, 0 wrong), or with `format_term` the paper's shaped term:
0 when the conductor's plan did not parse, 0.5 when it parsed but the answer is wrong, 1 when right.
With `human_labels`, a run a reviewer marked correct or wrong (review.annotations.services) is right or wrong by
that verdict, whatever its scorer said; runs without a verdict keep their score.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from routing.errors import ServiceError


@dataclass(frozen=True)
class RewardConfig:
    correctness: float = 1.0
    cost_penalty_per_usd: float = 0.0
    format_term: bool = False
    human_labels: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RewardConfig:
        data = dict(data or {})
        unknown = set(data) - {"correctness", "cost_penalty_per_usd", "format_term", "human_labels"}
        if unknown:
            raise ServiceError(f"unknown reward settings: {sorted(unknown)}")
        try:
            config = cls(
                correctness=float(data.get("correctness", 1.0)),
                cost_penalty_per_usd=float(data.get("cost_penalty_per_usd", 0.0)),
                format_term=parse_bool(data.get("format_term", False), "format_term"),
                human_labels=parse_bool(data.get("human_labels", False), "human_labels"),
            )
        except (TypeError, ValueError) as exc:
            raise ServiceError(f"reward settings: {exc}") from exc
        if not all(math.isfinite(v) for v in (config.correctness, config.cost_penalty_per_usd)):
            raise ServiceError("reward weights must be finite numbers")
        if config.correctness < 0 or config.cost_penalty_per_usd < 0:
            raise ServiceError("reward weights must not be negative")
        return config

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_bool(value: Any, name: str = "format_term") -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "1", "yes", "on", "false", "0", "no", "off", ""}:
        return value.lower() in {"true", "1", "yes", "on"}
    raise ValueError(f"{name} must be true or false, not {value!r}")


@dataclass(frozen=True)
class RunReward:
    parsed: bool
    correct: float | None
    cost_usd: Decimal
    term: float
    reward: float


FORMAT_TERM_PARSED = 0.5  # the paper: 0 when the workflow does not parse, 0.5 when it does, 1 when correct


def format_term(*, parsed: bool, correct: float | None) -> float:
    """The paper's format term (also TRL's format reward, training.lora.format_reward)."""
    return 0.0 if not parsed else (1.0 if correct == 1.0 else FORMAT_TERM_PARSED)


def reward_of(
    *, parsed: bool, correct: float | None, cost_usd: Decimal | float, config: RewardConfig
) -> RunReward:
    """The one reward formula: the engine's runs, the datasets, the learned policy's training."""
    if config.format_term:
        term = format_term(parsed=parsed, correct=correct)
    else:
        term = float(correct or 0.0) if parsed else 0.0
    value = config.correctness * term - config.cost_penalty_per_usd * float(cost_usd)
    return RunReward(parsed, correct, cost_usd, term, round(value, 8))


def run_reward(run: Any, config: RewardConfig) -> RunReward:
    """The reward of a finished run: did its top-level plan parse, was it right, what did it cost."""
    parsed = run.decisions.filter(depth=0, valid=True).exists()
    return reward_of(parsed=parsed, correct=run.score, cost_usd=run.cost_usd, config=config)


def group_advantages(rewards: list[float], *, scale: bool = False) -> list[float]:
    """GRPO's group-relative advantages: reward minus the group mean (divided by the group's std with
    `scale`, as in the original GRPO; without, as in Dr. GRPO)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not scale:
        return [round(c, 8) for c in centred]
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [round(c / (std + 1e-4), 8) for c in centred]
