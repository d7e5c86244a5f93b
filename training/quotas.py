"""How many offline runs a training request may start, in one place: the web forms, the API's
serializers and training.services check the same limits with the same messages, and the preview (the
pages' "Preview" button, the API's "dry_run") shows the same estimate the start acts on.

- MAX_RUNS_PER_REQUEST: the runs one request may create (rollouts: items x K; evaluations: items x 2,
  the candidate and the baseline each plan every item).
- An evaluation's limit may not be more than the items of its split (it is refused, never capped).
- CONDUCTOR_MAX_QUEUED_RUNS_PER_USER (a setting): the offline runs (rollouts + evaluations) one user
  may have queued or running at once; a start that would go above it is refused.

What a LoRA job's dataset must hold to teach anything is here too: a group with a learning signal
(unless the job asks for `allow_no_signal`) and at least the prompts one optimizer step takes.

Each check raises django.core.exceptions.ValidationError; the services turn it into a TrainingError.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q

from routing.estimates import mean_cost
from routing.models import RUN_ENDED, ConductorVersion, Run
from training.durations import Duration
from training.models import Dataset

MAX_ITEMS = 5000  # items one rollout, evaluation or upload may take
MAX_RUNS_PER_REQUEST = 2000
EVALUATION_SIDES = 2  # the candidate and the baseline each plan every item
OFFLINE_KINDS = (Run.Kind.ROLLOUT, Run.Kind.EVALUATION)
USD_PLACES = Decimal("0.0001")


def max_queued_runs_per_user() -> int:
    """CONDUCTOR_MAX_QUEUED_RUNS_PER_USER (a setting, so read at each call)."""
    return settings.CONDUCTOR_MAX_QUEUED_RUNS_PER_USER


def rollout_runs_check(items: int, k: int) -> int:
    """The runs of `items` items x K samples, against MAX_RUNS_PER_REQUEST; returns their number."""
    return _runs_check(items * k, f"{items:,} items x K={k}")


def evaluation_runs_check(items: int) -> int:
    """The runs of an evaluation of `items` items (x 2 sides), against MAX_RUNS_PER_REQUEST."""
    return _runs_check(items * EVALUATION_SIDES, f"{items:,} items x {EVALUATION_SIDES} sides")


def lora_runs_check(max_steps: int, prompts_per_step: int, num_generations: int) -> int:
    """The engine runs an llm-lora job makes (each sampled plan is run to earn its reward)."""
    return _runs_check(
        max_steps * prompts_per_step * num_generations,
        f"{max_steps:,} steps x {prompts_per_step} prompts x {num_generations} generations, each plan run",
    )


def _runs_check(runs: int, how: str) -> int:
    if runs > MAX_RUNS_PER_REQUEST:
        raise ValidationError(
            f"This request would start {runs:,} runs ({how}); at most {MAX_RUNS_PER_REQUEST:,} runs "
            "per request. Ask for fewer items (or a smaller K).",
            code="too_many_runs",
        )
    return runs


def lora_signal_check(dataset: Dataset, allow_no_signal: bool) -> None:
    """A GRPO job learns from the spread of rewards within a group: on a dataset where every group's
    samples earned the same, every advantage is 0. Refused unless the job asks for it explicitly (a
    dataset built before groups with signal were counted is not refused)."""
    if dataset.teaches_nothing and not allow_no_signal:
        raise ValidationError(
            f"{dataset} has no learning signal: {dataset.signal}. Every sample of each group earned the "
            "same reward, so every advantage is 0 and a GRPO job on it would learn nothing. Sample more per "
            "item (a larger K), or items the conductor sometimes gets wrong, and build again; or set "
            "allow_no_signal to train on it anyway.",
            code="no_learning_signal",
        )


def lora_prompts_check(dataset: Dataset, prompts_per_step: int) -> None:
    """TRL's GRPO sampler draws whole steps of `prompts_per_step` distinct prompts and drops a partial
    one: with fewer training prompts than that, the trainer finds no batch and stops at step 0."""
    prompts = (dataset.counts or {}).get("train")
    if prompts is not None and prompts < prompts_per_step:
        raise ValidationError(
            f"{dataset} has {prompts:,} training prompt{'' if prompts == 1 else 's'}; a step takes "
            f"prompts_per_step={prompts_per_step} of them, so the trainer would find no full step and "
            f"stop at step 0. Ask for at most {prompts:,} prompts per step, or build the dataset from more "
            "items.",
            code="too_few_prompts",
        )


def evaluation_limit_check(split: str, split_items: int, limit: int) -> None:
    """An evaluation's limit against the items its split has: more is refused, not silently capped."""
    if limit > split_items:
        raise ValidationError(
            f"The {split} split has {split_items:,} items; an evaluation limit of {limit:,} is more than "
            f"that. Ask for at most {split_items:,}.",
            code="limit_above_split",
        )


def queued_runs(user: Any) -> int:
    """The offline runs (rollouts + evaluations) `user` started that have not finished yet."""
    if not getattr(user, "is_authenticated", False):
        return 0
    return (
        Run.objects.filter(kind__in=OFFLINE_KINDS)
        .exclude(status__in=RUN_ENDED)
        .filter(Q(rollout__batch__created_by=user) | Q(evaluation_run__evaluation__created_by=user))
        .count()
    )


def queued_runs_check(user: Any, runs: int) -> None:
    """Starting `runs` more may not take `user` above CONDUCTOR_MAX_QUEUED_RUNS_PER_USER. A start
    without a signed-in user (a management command) is not counted against anyone."""
    if not getattr(user, "is_authenticated", False):
        return
    cap = max_queued_runs_per_user()
    queued = queued_runs(user)
    if queued + runs > cap:
        raise ValidationError(
            f"You have {queued:,} offline runs queued or running; {runs:,} more would take you above the "
            f"limit of {cap:,} per user (CONDUCTOR_MAX_QUEUED_RUNS_PER_USER). Wait for some to finish.",
            code="too_many_queued_runs",
        )


# --- the estimate shown before starting ---------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """What a start would do: how many runs, and about what they cost (None: nothing to estimate from)."""

    runs: int
    usd: Decimal | None
    basis: str
    duration: Duration | None = None  # an evaluation's: about how long it takes (training.durations)

    @property
    def message(self) -> str:
        if self.usd is None:
            said = f"This will start {self.runs:,} runs; no finished runs to estimate the cost from."
        else:
            said = f"This will start {self.runs:,} runs, about ${self.usd} (estimated from {self.basis})."
        return said if self.duration is None else f"{said} {self.duration.message}"

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "runs": self.runs,
            "estimated_usd": None if self.usd is None else str(self.usd),
            "estimated_from": self.basis,
            "message": self.message,
        }
        if self.duration is not None:
            found["expected_duration"] = self.duration.as_dict()
        return found


def estimate(parts: list[tuple[ConductorVersion, int]]) -> Estimate:
    """The runs each version would make, priced at the mean cost of its finished runs (or of all)."""
    total, bases, unknown = Decimal("0"), [], False
    for version, runs in parts:
        mean = mean_cost(version)
        if mean is None:
            unknown = True
            continue
        total += mean.usd * runs
        bases.append(mean.basis)
    runs = sum(runs for _, runs in parts)
    if unknown:
        return Estimate(runs=runs, usd=None, basis="no finished runs to estimate from")
    return Estimate(runs=runs, usd=total.quantize(USD_PLACES), basis="; ".join(bases))


def estimate_check(found: Estimate, shown: Decimal | None = None, budget: Decimal | None = None) -> None:
    """A start against what was shown and what may be spent: refused when the estimate changed since
    the preview showed `shown` (finished runs moved the mean: preview again), or when it is above the
    `budget` the user gave (an estimate that cannot be made is refused under a budget too)."""
    if shown is not None and found.usd != shown:
        now = "cannot be estimated now" if found.usd is None else f"is now ${found.usd}"
        raise ValidationError(
            f"The estimate shown was ${shown}; it {now}. Nothing was started: preview again.",
            code="estimate_changed",
        )
    if budget is not None and (found.usd is None or found.usd > budget):
        said = "cannot be estimated" if found.usd is None else f"is about ${found.usd}"
        raise ValidationError(
            f"This would start {found.runs:,} runs, which {said}: above the budget of ${budget}. "
            "Nothing was started.",
            code="over_budget",
        )
