"""Training jobs: the settings of each backend (checked here, against the one table of limits), start,
cancel.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.actions import Action
from audit.services import Actor, event_record
from routing.limits import name_check
from routing.models import ConductorVersion

from .. import quotas
from ..itemsets.selectors import REPLAY_SET, is_replay, latest_version, split_ids
from ..itemsets.services import version_freeze
from ..local_base import is_local_base, local_base_available
from ..models import Dataset, JobStatus, TrainingJob
from ..rewards import parse_bool
from .common import TrainingError, check_or_refuse, user_of

LEARNED_DEFAULTS = {
    "item_set": REPLAY_SET,  # without a dataset: the set and split it trains on
    "item_set_version": None,  # set by job_start: the version it froze
    "split": "train",
    "limit": None,
    "epochs": 40,
    "learning_rate": 3.0,
    "group_size": 16,
    "cost_penalty_per_usd": 20.0,
    # Cross-validation (training.frontier) of the per-kind fallback at the job's cost penalty, and with
    # `frontier` of every penalty of the grid (the curve the training page plots; about 13x the time).
    "folds": 3,
    "frontier": True,
}


LORA_DEFAULTS = {
    "base_model_path": "",
    "max_steps": 20,
    "num_generations": 4,
    "prompts_per_step": 4,
    "learning_rate": 1e-4,
    "lora_r": 8,
    "max_completion_length": 256,
    "cost_penalty_per_usd": 0.0,
    "format_term": True,
    # On a GPU: generate with TRL's vLLM server (`trl vllm-serve`) instead of transformers.
    "use_vllm": False,
    "vllm_server_base_url": "",
    # Train on a dataset none of whose groups carries a learning signal (training.quotas refuses it
    # otherwise); the start's audit event records the choice with the other options.
    "allow_no_signal": False,
}


# What each backend's settings may be: (type, lowest, highest). The one place for these limits: the
# service checks them, the job form takes its fields' bounds from here.
LEARNED_LIMITS: dict[str, tuple[type, float, float]] = {
    "epochs": (int, 1, 500),
    "learning_rate": (float, 1e-6, 100),
    "group_size": (int, 2, 64),
    "cost_penalty_per_usd": (float, 0, 10_000),
    "limit": (int, 1, 1_000_000),
    "folds": (int, 2, 10),
}


LORA_LIMITS: dict[str, tuple[type, float, float]] = {
    "max_steps": (int, 1, 100_000),
    "num_generations": (int, 2, 64),
    "prompts_per_step": (int, 1, 1024),
    "learning_rate": (float, 1e-8, 1),
    "lora_r": (int, 1, 256),
    "max_completion_length": (int, 8, 4096),
    "cost_penalty_per_usd": (float, 0, 10_000),
}


def _numbers(merged: dict[str, Any], bounds: dict[str, tuple[type, float, float]], *keys: str) -> None:
    for key in keys:
        if merged.get(key) is not None:
            merged[key] = _number(merged, key, *bounds[key])


def _number(options: dict[str, Any], key: str, kind: type, low: float, high: float) -> Any:
    try:
        value = kind(options[key])
    except (TypeError, ValueError) as exc:
        raise TrainingError(f"{key} must be a number") from exc
    if not low <= value <= high:
        raise TrainingError(f"{key} must be between {low} and {high}")
    return value


def job_options(backend: str, options: dict[str, Any], dataset: Dataset | None) -> dict[str, Any]:
    """The backend's settings, defaults filled in and every value checked."""
    if backend == TrainingJob.Backend.LEARNED:
        merged = {**LEARNED_DEFAULTS, **{k: v for k, v in options.items() if v not in (None, "")}}
        unknown = set(merged) - set(LEARNED_DEFAULTS)
        if unknown:
            raise TrainingError(f"unknown settings for the learned backend: {sorted(unknown)}")
        _numbers(merged, LEARNED_LIMITS, *LEARNED_LIMITS)
        try:
            merged["frontier"] = parse_bool(merged["frontier"])
        except ValueError as exc:
            raise TrainingError(f"frontier must be true or false, not {merged['frontier']!r}") from exc
        if dataset is None:
            split_ids(str(merged["item_set"]), merged["split"], 1)  # the split must exist
        return merged
    if backend == TrainingJob.Backend.LLM_LORA:
        merged = {**LORA_DEFAULTS, **{k: v for k, v in options.items() if v not in (None, "")}}
        unknown = set(merged) - set(LORA_DEFAULTS)
        if unknown:
            raise TrainingError(f"unknown settings for the llm-lora backend: {sorted(unknown)}")
        if dataset is None:
            raise TrainingError("the llm-lora backend trains on a dataset: choose one")
        if importlib.util.find_spec("trl") is None:
            raise TrainingError(
                "the llm-lora backend needs the train extra (torch, transformers, TRL, PEFT): "
                "pip install -e '.[train]' (make demo and make test install it)"
            )
        base = Path(str(merged["base_model_path"] or settings.VAR_DIR / "models" / "tiny-qwen2"))
        try:
            # The local model's checkpoint is made by the job itself, from the installed weights.
            found = (base / "config.json").is_file() or (is_local_base(base) and local_base_available())
        except OSError as exc:  # e.g. a path component too long for the file system
            raise TrainingError(f"not a usable model path: {exc}") from exc
        if not found:
            raise TrainingError(f"no model at {base} (a directory with config.json, from save_pretrained)")
        merged["base_model_path"] = str(base)
        _numbers(merged, LORA_LIMITS, *LORA_LIMITS)
        check_or_refuse(
            quotas.lora_runs_check, merged["max_steps"], merged["prompts_per_step"], merged["num_generations"]
        )
        try:
            merged["format_term"] = parse_bool(merged["format_term"])
            merged["use_vllm"] = parse_bool(merged["use_vllm"], "use_vllm")
            merged["allow_no_signal"] = parse_bool(merged["allow_no_signal"], "allow_no_signal")
        except ValueError as exc:
            raise TrainingError(str(exc)) from exc
        check_or_refuse(quotas.lora_signal_check, dataset, merged["allow_no_signal"])
        check_or_refuse(quotas.lora_prompts_check, dataset, merged["prompts_per_step"])
        if merged["use_vllm"] and not str(merged["vllm_server_base_url"]).startswith(("http://", "https://")):
            raise TrainingError("use_vllm needs vllm_server_base_url, the address of `trl vllm-serve`")
        return merged
    raise TrainingError(f"unknown backend {backend!r}")


def job_start(
    *,
    name: str,
    backend: str,
    dataset: Dataset | None,
    options: dict[str, Any],
    actor: Actor,
    user: Any = None,
    queue: bool = True,
) -> TrainingJob:
    """Record a training job and queue it on the training queue (queue=False: the caller runs
    training.tasks.train_job itself, as `manage.py train_conductor` does)."""
    check_or_refuse(name_check, name)  # routing.limits.NAME_PATTERN: the name of the version it registers
    if ConductorVersion.objects.filter(name=name).exists() or TrainingJob.objects.filter(name=name).exists():
        raise TrainingError(f"the name {name!r} is taken; choose another")
    checked = job_options(backend, options, dataset)
    try:
        with transaction.atomic():
            if (
                backend == TrainingJob.Backend.LEARNED
                and dataset is None
                and not is_replay(checked["item_set"])
            ):
                # The job reads the frozen version it started on, whatever is added to the set meanwhile.
                used = version_freeze(
                    version=latest_version(checked["item_set"]), actor=actor, why=f"job {name}"
                )
                checked["item_set_version"] = used.number
            job = TrainingJob.objects.create(
                name=name, backend=backend, dataset=dataset, options=checked, created_by=user_of(user)
            )
            event_record(
                actor=actor,
                action=Action.TRAINING_JOB_STARTED,
                obj=job,
                payload={
                    "name": name,
                    "backend": backend,
                    "dataset": str(dataset) if dataset else None,
                    "options": checked,
                },
            )
            if queue:
                transaction.on_commit(lambda: _queue_job(job.pk))
    except IntegrityError as exc:  # a concurrent request took the name a moment ago
        raise TrainingError(f"the name {name!r} is taken; choose another") from exc
    return job


def _queue_job(job_id: int) -> None:
    # By name: tasks call services, never the other way (CELERY_TASK_ROUTES sends it to `training`).
    result = current_app.send_task("training.tasks.train_job", args=(job_id,))
    TrainingJob.objects.filter(pk=job_id).update(celery_task_id=result.id or "")


def job_cancel(*, job: TrainingJob, actor: Actor) -> TrainingJob:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if job.finished:
            raise TrainingError(f"the job has already {job.status}")
        job.cancel_requested = True
        fields = ["cancel_requested"]
        if job.status == JobStatus.QUEUED:  # never started: nothing to stop
            job.status, job.finished_at = JobStatus.CANCELLED, timezone.now()
            fields += ["status", "finished_at"]
        job.save(update_fields=fields)
        event_record(
            actor=actor, action=Action.TRAINING_JOB_CANCEL_REQUESTED, obj=job, payload={"status": job.status}
        )
    return job
