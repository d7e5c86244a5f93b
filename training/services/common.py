"""What the training services share: their actor, their error, their limits, the guards every start goes through."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection

from accounts.roles import recorded_user
from audit.services import Actor
from routing.models import RUN_ENDED, ConductorVersion
from training.quotas import MAX_ITEMS as MAX_ITEMS  # re-exported: what the services and forms import

from .. import quotas
from ..errors import TrainingError

SERVICE = Actor.service("training")  # who training's own work (jobs, settling) is recorded as

TRAINING_KEY_PREFIX = "training:"  # idempotency keys of training tasks; refused for submissions


MAX_K = 64


MAX_TEMPERATURE = 5.0

# The rollout form's defaults: settings whose groups teach (a GRPO group teaches only if its rewards
# differ). The temperature depends on the kind of conductor: rollout_temperature.
ROLLOUT_DEFAULTS = {"limit": 20, "k": 8}

# A trained learned policy is near-greedy at temperature 1 (its best workflow's logit stands some ten
# above the rest: probability 0.85 to 1.00 on the replay items), and the dataset's default reward counts
# correctness only, so a group teaches only where its samples differ in workflow and one of them is
# right where another is wrong. At temperature 1 and K=4, 20 replay items gave no such group; at
# temperature 4 and K=8 about one in five does.
LEARNED_ROLLOUT_TEMPERATURE = 4.0
# An LLM's logits are not spread like that: at 4.0 it writes noise, not plans. GRPO samples an LLM's
# groups at 1.0, the model's own distribution (the Conductor paper, DeepSeek's GRPO, TRL's default, and
# training.lora's DEFAULT_SETTINGS): rollouts at the temperature the trainer samples at give groups
# from the distribution it learns from. The static rules plan alike at any temperature.
LLM_ROLLOUT_TEMPERATURE = 1.0


def rollout_temperature(backend: str) -> float:
    """The temperature rollouts of a conductor of `backend` (routing's ConductorVersion.Backend) sample
    at when the start names none (the form's field left empty, the API's left out): rollouts_start
    applies it, and the form shows each version's."""
    if backend == ConductorVersion.Backend.LEARNED:
        return LEARNED_ROLLOUT_TEMPERATURE
    return LLM_ROLLOUT_TEMPERATURE


ROLLOUT_TEMPERATURE_HELP = (
    f"Empty: the conductor's default, {LEARNED_ROLLOUT_TEMPERATURE:g} for a learned policy (near-greedy at "
    f"1: its samples would all be one workflow), {LLM_ROLLOUT_TEMPERATURE:g} for an LLM conductor (its "
    "own distribution, as GRPO samples it; higher writes noise)"
)


QUEUED_RUNS_LOCK_NAMESPACE = 0x51756575  # "Queu": one start of offline runs per user at a time


FINISHED_RUN = RUN_ENDED  # the runs a rollout, dataset or evaluation counts as done


def check_or_refuse(check: Any, *args: Any) -> Any:
    """Run a check of routing.limits / training.quotas; its refusal becomes a TrainingError."""
    try:
        return check(*args)
    except ValidationError as exc:
        raise TrainingError(" ".join(exc.messages)) from exc


def queued_runs_guard(user: Any, runs: int) -> None:
    """Inside the start's transaction: the user's queued offline runs plus `runs` against
    CONDUCTOR_MAX_QUEUED_RUNS_PER_USER, counted under a per-user lock (two starts at once cannot
    both squeeze under the cap)."""
    if getattr(user, "is_authenticated", False):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [QUEUED_RUNS_LOCK_NAMESPACE, str(user.pk)]
            )
    check_or_refuse(quotas.queued_runs_check, user, runs)


def user_of(user: Any) -> Any:
    return recorded_user(user)
