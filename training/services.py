"""Writes for training: rollouts, datasets, jobs, evaluations, promotion, rollback and shadow mode.

Each write is one transaction with its audit event; work that takes time (runs, training) is queued
on commit. Bad input raises TrainingError with a message meant for the person who gave it.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import statistics
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from celery import current_app
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from audit.actions import Action
from audit.models import AuditEvent
from audit.services import Actor, event_record
from routing import replay
from routing.errors import ServiceError
from routing.limits import name_check
from routing.models import ConductorVersion, DataClass, Decision, Run, RunStatus, Task
from routing.secrets import redact
from routing.services import conductor_activate, run_enqueue

from . import limits
from .models import Dataset, Evaluation, EvaluationRun, JobStatus, Rollout, RolloutBatch, TrainingJob
from .rewards import RewardConfig, RunReward, group_advantages, parse_bool, reward_of

MAX_ITEMS = 5000
TRAINING_KEY_PREFIX = "training:"  # idempotency keys of training tasks; refused for submissions
MAX_K = 64
MAX_TEMPERATURE = 5.0
DATASET_LOCK_NAMESPACE = 0x44617461  # "Data": one build of a dataset name at a time
QUEUED_RUNS_LOCK_NAMESPACE = 0x51756575  # "Queu": one start of offline runs per user at a time
FINISHED_RUN = (RunStatus.SUCCEEDED, RunStatus.FAILED)


class TrainingError(ServiceError):
    """The request cannot be carried out; the message says why."""


def _checked(check: Any, *args: Any) -> Any:
    """Run a check of routing.limits / training.limits; its refusal becomes a TrainingError."""
    try:
        return check(*args)
    except ValidationError as exc:
        raise TrainingError(" ".join(exc.messages)) from exc


def _queued_runs_guard(user: Any, runs: int) -> None:
    """Inside the start's transaction: the user's queued offline runs plus `runs` against
    CONDUCTOR_MAX_QUEUED_RUNS_PER_USER, counted under a per-user lock (two starts at once cannot
    both squeeze under the cap)."""
    if getattr(user, "is_authenticated", False):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [QUEUED_RUNS_LOCK_NAMESPACE, str(user.pk)]
            )
    _checked(limits.queued_runs_check, user, runs)


# --- items --------------------------------------------------------------------------------------


def replay_item_ids(split: str, limit: int | None = None, domain: str = "") -> list[str]:
    """Recorded items of a split, in a fixed shuffled order (domains mixed), optionally of one domain."""
    try:
        items = replay.read_items(replay.split_path(split))
    except replay.ReplayDataError as exc:
        raise TrainingError(str(exc)) from exc
    ids = [item.id for item in items if not domain or item.domain == domain]
    if not ids:
        raise TrainingError(f"no items in the {split} split" + (" for this domain" if domain else ""))
    random.Random(0).shuffle(ids)
    return ids[:limit] if limit else ids


def replay_items(item_ids: list[str]) -> list[replay.ReplayItem]:
    if not item_ids:
        raise TrainingError("choose at least one item")
    if len(item_ids) > MAX_ITEMS:
        raise TrainingError(f"{len(item_ids)} items; at most {MAX_ITEMS} at once")
    found, missing = [], []
    for item_id in dict.fromkeys(item_ids):
        try:
            item = replay.find_item(item_id=item_id, texts=[])
        except replay.ReplayDataError as exc:
            raise TrainingError(str(exc)) from exc
        (found if item is not None and item.id == item_id else missing).append(item or item_id)
    if missing:
        raise TrainingError(f"unknown items: {', '.join(map(str, missing[:5]))}")
    return found


def item_task(item: replay.ReplayItem, actor: Actor) -> Task:
    """The task that stands for a recorded item in rollouts and evaluations (one per item)."""
    task, created = Task.objects.get_or_create(
        idempotency_key=f"{TRAINING_KEY_PREFIX}{item.id}",
        source=Task.Source.TRAINING,
        defaults={
            "text": item.task,
            "reference": item.reference,
            "domain": item.domain,
            "source_item": item.id,
            "classification": DataClass.PUBLIC,
            "max_steps": settings.CONDUCTOR_DEFAULT_MAX_STEPS,
            "max_depth": settings.CONDUCTOR_DEFAULT_MAX_DEPTH,
            "max_usd": settings.CONDUCTOR_DEFAULT_MAX_USD,
            "status": RunStatus.RUNNING,
        },
    )
    if created:
        event_record(
            actor=actor,
            action=Action.TASK_SUBMITTED,
            obj=task,
            task_id=task.id,
            payload={"source": Task.Source.TRAINING, "item": item.id, "classification": task.classification},
        )
    else:
        Task.objects.filter(pk=task.pk).update(status=RunStatus.RUNNING, finished_at=None)
    return task


def _offline_runs(specs: list[tuple[Task, ConductorVersion]], kind: str, **fields: Any) -> list[Run]:
    """Runs of a training kind, inserted at once and queued when the transaction commits."""
    runs = Run.objects.bulk_create(
        [Run(task=task, conductor_version=version, kind=kind, **fields) for task, version in specs]
    )
    ids = [run.pk for run in runs]
    transaction.on_commit(lambda: [run_enqueue(run_id=run_id) for run_id in ids])
    return runs


# --- rollouts -----------------------------------------------------------------------------------


def _rollouts_checked(items: list[str], k: int, temperature: float) -> list[replay.ReplayItem]:
    if not 1 <= k <= MAX_K:
        raise TrainingError(f"K must be between 1 and {MAX_K}")
    if not 0 < temperature <= MAX_TEMPERATURE:
        raise TrainingError(f"the temperature must be above 0 and at most {MAX_TEMPERATURE:g}")
    _checked(limits.rollout_runs_check, len(dict.fromkeys(items)), k)  # before reading the items
    return replay_items(items)


def rollouts_estimate(
    *, version: ConductorVersion, items: list[str], k: int, temperature: float, user: Any = None
) -> limits.Estimate:
    """What rollouts_start would start (runs, estimated cost), checked as it checks; starts nothing."""
    runs = len(_rollouts_checked(items, k, temperature)) * k
    _checked(limits.queued_runs_check, user, runs)
    return limits.estimate([(version, runs)])


def rollouts_start(
    *, version: ConductorVersion, items: list[str], k: int, temperature: float, actor: Actor, user: Any = None
) -> RolloutBatch:
    """Sample K workflows per item from `version` at `temperature`; each runs through the engine.
    Refused (nothing written) above training.limits' runs per request or the user's queued runs."""
    found = _rollouts_checked(items, k, temperature)
    with transaction.atomic():
        _queued_runs_guard(user, len(found) * k)
        batch = RolloutBatch.objects.create(
            conductor_version=version,
            k=k,
            temperature=temperature,
            items=[i.id for i in found],
            status=JobStatus.RUNNING,
            created_by=_user(user),
        )
        tasks = [(item, item_task(item, actor)) for item in found]
        runs = iter(
            _offline_runs(
                [(task, version) for _, task in tasks for _ in range(k)],
                Run.Kind.ROLLOUT,
                temperature=temperature,
            )
        )
        Rollout.objects.bulk_create(
            [
                Rollout(batch=batch, task=task, run=next(runs), item=item.id, sample=sample)
                for item, task in tasks
                for sample in range(k)
            ]
        )
        event_record(
            actor=actor,
            action=Action.ROLLOUTS_STARTED,
            obj=batch,
            payload={
                "conductor": version.name,
                "k": k,
                "temperature": temperature,
                "items": len(found),
                "runs": len(found) * k,
            },
        )
    return batch


def rollout_batch_refresh(batch: RolloutBatch) -> dict[str, int]:
    """Counts of the batch's runs; marks the batch finished (audited) once every run has ended."""
    runs = Run.objects.filter(rollout__batch=batch)
    counts = {
        "runs": runs.count(),
        "finished": runs.filter(status__in=FINISHED_RUN).count(),
        "failed": runs.filter(status=RunStatus.FAILED).count(),
    }
    if batch.status == JobStatus.RUNNING and counts["finished"] == counts["runs"]:
        with transaction.atomic():
            updated = RolloutBatch.objects.filter(pk=batch.pk, status=JobStatus.RUNNING).update(
                status=JobStatus.SUCCEEDED
            )
            if updated:
                event_record(
                    actor=Actor.service("training"),
                    action=Action.ROLLOUTS_FINISHED,
                    obj=batch,
                    payload=counts,
                )
        batch.status = JobStatus.SUCCEEDED
    return counts


# --- datasets -----------------------------------------------------------------------------------


def conductor_prompt(task: Task) -> list[dict[str, str]]:
    """The messages an LLM conductor is given for this task with today's pool (the GRPO prompt)."""
    from routing.conductors import LLMConductor
    from routing.engine.planning import plan_request, screened_workers

    workers, _ = screened_workers(task)
    request = plan_request(task, workers, remaining_steps=task.max_steps, depth=0)
    if not workers:
        raise TrainingError(f"no enabled worker may receive {task.classification} data: no prompt to write")
    return LLMConductor({"model": "conductor"}).messages(request)


def _split_of(item: str, validation_fraction: float) -> str:
    bucket = int(hashlib.sha256(item.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "validation" if bucket < validation_fraction else "train"


@dataclass(frozen=True)
class DatasetFilter:
    batch_ids: list[int] | None = None
    conductor_version: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    items: list[str] | None = None
    min_group_size: int = 2

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_ids": self.batch_ids,
            "conductor_version": self.conductor_version,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "items": self.items,
            "min_group_size": self.min_group_size,
        }


def dataset_build(
    *,
    name: str,
    batch_ids: list[int] | None = None,
    conductor_version: ConductorVersion | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    items: list[str] | None = None,
    min_group_size: int = 2,
    reward_config: RewardConfig | None = None,
    validation_fraction: float = 0.1,
    actor: Actor,
    user: Any = None,
) -> Dataset:
    """A new version of dataset `name` from the finished rollouts that match the filter.

    One row per group (an item): the conductor's prompt (TRL's `prompt` column, conversational), the
    group's completions (`group_completions`: the plans as written; TRL passes its own `completions` to
    reward functions), their rewards and group-relative advantages, and what the reward functions need
    (item, reference, domain, scorer). Files: train/validation as Parquet and
    JSON Lines, and manifest.json (filter, counts, content hash, source run ids).
    """
    _checked(name_check, name)  # routing.limits.NAME_PATTERN: ASCII only, no look-alikes
    if min_group_size < 1:
        raise TrainingError("the minimum group size is at least 1")
    if not 0 <= validation_fraction < 1:
        raise TrainingError("the validation fraction is between 0 and 1")
    if since and until and since >= until:
        raise TrainingError("the period is empty: 'since' is not before 'until'")
    reward_config = reward_config or RewardConfig()
    selection = DatasetFilter(
        batch_ids=batch_ids,
        conductor_version=conductor_version.name if conductor_version else None,
        since=since,
        until=until,
        items=items,
        min_group_size=min_group_size,
    )
    rollouts = Rollout.objects.filter(run__status__in=FINISHED_RUN).select_related("run", "task")
    if batch_ids:
        rollouts = rollouts.filter(batch_id__in=batch_ids)
    if conductor_version is not None:
        # A trainer's samples are the plans of the model being trained, whatever version ran them.
        rollouts = rollouts.filter(run__conductor_version=conductor_version, batch__training_job__isnull=True)
    if since:
        rollouts = rollouts.filter(run__created_at__gte=since)
    if until:
        rollouts = rollouts.filter(run__created_at__lt=until)
    if items:
        rollouts = rollouts.filter(item__in=items)
    found = list(rollouts.order_by("item", "run_id"))
    root_plans = _root_plans([r.run_id for r in found])
    groups: dict[str, list[tuple[Rollout, RunReward]]] = {}
    ungraded = 0
    for rollout in found:
        earned = reward_of(
            parsed=root_plans.get(rollout.run_id, ("", False))[1],
            correct=rollout.run.score,
            cost_usd=rollout.run.cost_usd,
            config=reward_config,
        )
        if earned.parsed and earned.correct is None and rollout.task.reference:
            ungraded += 1  # the plan ran but nothing graded it (a failed call, no judge): no reward to learn
            continue
        groups.setdefault(rollout.item, []).append((rollout, earned))
    kept = {item: members for item, members in groups.items() if len(members) >= min_group_size}
    if not kept:
        raise TrainingError(
            f"no group of at least {min_group_size} finished rollouts matches the filter "
            f"({len(groups)} smaller groups, {ungraded} ungraded samples left out)"
        )
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "validation": []}
    prompts: dict[Any, list[dict[str, str]]] = {}
    run_ids: list[int] = []
    for item, pairs in sorted(kept.items()):
        members = [rollout for rollout, _ in pairs]
        rewards = [earned for _, earned in pairs]
        task = members[0].task
        if task.pk not in prompts:
            prompts[task.pk] = conductor_prompt(task)
        values = [r.reward for r in rewards]
        run_ids += [r.run_id for r in members]
        rows[_split_of(item, validation_fraction)].append(
            {
                "prompt": prompts[task.pk],
                "item": item,
                "task_id": str(task.pk),
                "domain": task.domain,
                "reference": task.reference,
                "scorer": task.scorer,
                "group_completions": [root_plans.get(r.run_id, ("", False))[0] for r in members],
                "rewards": values,
                "advantages": group_advantages(values),
                "scores": [r.correct for r in rewards],
                "parsed": [r.parsed for r in rewards],
                "costs_usd": [str(r.cost_usd) for r in rewards],
                "run_ids": [r.run_id for r in members],
            }
        )
    with transaction.atomic():
        # One build of a name at a time: the next version number is read under this lock.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [DATASET_LOCK_NAMESPACE, name])
        version = (Dataset.objects.filter(name=name).aggregate(v=Max("version"))["v"] or 0) + 1
        relative = Path("datasets") / name / f"v{version}"
        directory = settings.VAR_DIR / relative
        if directory.exists():
            raise TrainingError(f"{relative} exists but no dataset names it; move it away first")
        counts = {
            "groups": len(kept),
            "train": len(rows["train"]),
            "validation": len(rows["validation"]),
            "completions": len(run_ids),
            "skipped_groups": len(groups) - len(kept),
            "ungraded_samples": ungraded,
        }
        try:
            content_hash = _write_files(directory, rows)
            dataset = Dataset.objects.create(
                name=name,
                version=version,
                filter=selection.as_dict(),
                reward_config=reward_config.as_dict(),
                counts=counts,
                content_hash=content_hash,
                source_run_ids=sorted(run_ids),
                path=str(relative),
                created_by=_user(user),
            )
            (directory / "manifest.json").write_text(json.dumps(_manifest(dataset), indent=2, default=str))
            event_record(
                actor=actor,
                action=Action.DATASET_BUILT,
                obj=dataset,
                payload={
                    "name": name,
                    "version": version,
                    "filter": selection.as_dict(),
                    "reward_config": reward_config.as_dict(),
                    "counts": counts,
                    "content_hash": content_hash,
                    "source_runs": len(run_ids),
                },
            )
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)  # this build made it: nothing half-written stays
            raise
    return dataset


def _root_plans(run_ids: list[int]) -> dict[int, tuple[str, bool]]:
    """Per run: the top-level plan text its conductor wrote (its last try), and whether a try parsed."""
    plans: dict[int, tuple[str, bool]] = {}
    for run_id, raw, valid in (
        Decision.objects.filter(run_id__in=run_ids, depth=0)
        .order_by("run_id", "attempt", "id")
        .values_list("run_id", "raw_output", "valid")
    ):
        plans[run_id] = (raw, valid or plans.get(run_id, ("", False))[1])
    return plans


def _write_files(directory: Path, rows: dict[str, list[dict[str, Any]]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    schema = pa.Table.from_pylist(rows["train"] or rows["validation"]).schema
    for split in ("train", "validation"):
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[split])
        data = lines.encode()
        digest.update(data)
        (directory / f"{split}.jsonl").write_bytes(data)
        pq.write_table(pa.Table.from_pylist(rows[split], schema=schema), directory / f"{split}.parquet")
    return digest.hexdigest()


def _manifest(dataset: Dataset) -> dict[str, Any]:
    return {
        "name": dataset.name,
        "version": dataset.version,
        "created_at": dataset.created_at.isoformat(),
        "filter": dataset.filter,
        "reward_config": dataset.reward_config,
        "counts": dataset.counts,
        "content_hash": {
            "algorithm": "sha256",
            "over": ["train.jsonl", "validation.jsonl"],
            "value": dataset.content_hash,
        },
        "source_run_ids": dataset.source_run_ids,
        "files": sorted(DATASET_FILES),
        "format": "TRL conversational: 'prompt' is a list of messages; the other columns reach reward functions",
    }


DATASET_FILES = ("train.parquet", "validation.parquet", "train.jsonl", "validation.jsonl", "manifest.json")


def dataset_preview(dataset: Dataset, limit: int = 5) -> list[dict[str, Any]]:
    """The first groups of the training split, each sample with its reward and advantage."""
    path = dataset_files(dataset).get("train.jsonl")
    if path is None:
        return []
    groups = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if len(groups) >= limit:
                break
            row = json.loads(line)
            samples = zip(
                row["group_completions"], row["rewards"], row["advantages"], row["run_ids"], strict=True
            )
            groups.append(
                {
                    "item": row["item"],
                    "task_id": row["task_id"],
                    "domain": row["domain"],
                    "task": row["prompt"][-1]["content"] if row["prompt"] else "",
                    "samples": [
                        {"completion": c, "reward": r, "advantage": a, "run_id": run}
                        for c, r, a, run in samples
                    ],
                }
            )
    return groups


def dataset_files(dataset: Dataset) -> dict[str, Path]:
    directory = settings.VAR_DIR / dataset.path
    return {name: directory / name for name in DATASET_FILES if (directory / name).exists()}


# --- training jobs ------------------------------------------------------------------------------

LEARNED_DEFAULTS = {
    "split": "train",
    "limit": None,
    "epochs": 40,
    "learning_rate": 3.0,
    "group_size": 16,
    "cost_penalty_per_usd": 20.0,
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
}


# What each backend's settings may be: (type, lowest, highest). The one place for these limits: the
# service checks them, the job form takes its fields' bounds from here.
LEARNED_LIMITS: dict[str, tuple[type, float, float]] = {
    "epochs": (int, 1, 500),
    "learning_rate": (float, 1e-6, 100),
    "group_size": (int, 2, 64),
    "cost_penalty_per_usd": (float, 0, 10_000),
    "limit": (int, 1, 1_000_000),
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
        if dataset is None:
            replay_item_ids(merged["split"], 1)  # the split must exist
        return merged
    if backend == TrainingJob.Backend.LLM_LORA:
        merged = {**LORA_DEFAULTS, **{k: v for k, v in options.items() if v not in (None, "")}}
        unknown = set(merged) - set(LORA_DEFAULTS)
        if unknown:
            raise TrainingError(f"unknown settings for the llm-lora backend: {sorted(unknown)}")
        if dataset is None:
            raise TrainingError("the llm-lora backend trains on a dataset: choose one")
        base = Path(str(merged["base_model_path"] or settings.VAR_DIR / "models" / "tiny-qwen2"))
        try:
            found = (base / "config.json").is_file()
        except OSError as exc:  # e.g. a path component too long for the file system
            raise TrainingError(f"not a usable model path: {exc}") from exc
        if not found:
            raise TrainingError(f"no model at {base} (a directory with config.json, from save_pretrained)")
        merged["base_model_path"] = str(base)
        _numbers(merged, LORA_LIMITS, *LORA_LIMITS)
        _checked(
            limits.lora_runs_check, merged["max_steps"], merged["prompts_per_step"], merged["num_generations"]
        )
        try:
            merged["format_term"] = parse_bool(merged["format_term"])
            merged["use_vllm"] = parse_bool(merged["use_vllm"])
        except ValueError as exc:
            raise TrainingError(str(exc)) from exc
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
    _checked(name_check, name)  # routing.limits.NAME_PATTERN: the name of the version it registers
    if ConductorVersion.objects.filter(name=name).exists() or TrainingJob.objects.filter(name=name).exists():
        raise TrainingError(f"the name {name!r} is taken; choose another")
    checked = job_options(backend, options, dataset)
    try:
        with transaction.atomic():
            job = TrainingJob.objects.create(
                name=name, backend=backend, dataset=dataset, options=checked, created_by=_user(user)
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


# --- evaluation ---------------------------------------------------------------------------------


def _evaluation_checked(
    candidate: ConductorVersion, baseline: ConductorVersion | None, split: str, limit: int
) -> tuple[ConductorVersion, list[replay.ReplayItem]]:
    from routing.services import conductor_active

    baseline = baseline or conductor_active()
    if baseline.pk == candidate.pk:
        raise TrainingError(f"{candidate.name} is the baseline itself; choose another candidate")
    if not 1 <= limit <= MAX_ITEMS:
        raise TrainingError(f"evaluate on 1 to {MAX_ITEMS} items")
    _checked(limits.evaluation_runs_check, limit)
    ids = replay_item_ids(split)
    _checked(limits.evaluation_limit_check, split, len(ids), limit)  # refused, never capped
    return baseline, replay_items(ids[:limit])


def evaluation_estimate(
    *,
    candidate: ConductorVersion,
    baseline: ConductorVersion | None = None,
    split: str = "dev",
    limit: int = 100,
    user: Any = None,
) -> limits.Estimate:
    """What evaluation_start would start (runs, estimated cost), checked as it checks; starts nothing."""
    baseline, found = _evaluation_checked(candidate, baseline, split, limit)
    _checked(limits.queued_runs_check, user, len(found) * limits.EVALUATION_SIDES)
    return limits.estimate([(candidate, len(found)), (baseline, len(found))])


def evaluation_start(
    *,
    candidate: ConductorVersion,
    baseline: ConductorVersion | None = None,
    split: str = "dev",
    limit: int = 100,
    actor: Actor,
    user: Any = None,
) -> Evaluation:
    """Run the candidate and the baseline (the active version by default) on the same held-out items.
    Refused (nothing written) above training.limits' runs per request or the user's queued runs, or
    when `limit` is more than the split's items."""
    baseline, found = _evaluation_checked(candidate, baseline, split, limit)
    with transaction.atomic():
        _queued_runs_guard(user, len(found) * limits.EVALUATION_SIDES)
        evaluation = Evaluation.objects.create(
            candidate=candidate,
            baseline=baseline,
            split=split,
            limit=limit,
            items=[i.id for i in found],
            status=JobStatus.RUNNING,
            created_by=_user(user),
        )
        sides = (("candidate", candidate), ("baseline", baseline))
        tasks = [(item, item_task(item, actor)) for item in found]
        runs = iter(
            _offline_runs([(task, version) for _, task in tasks for _, version in sides], Run.Kind.EVALUATION)
        )
        EvaluationRun.objects.bulk_create(
            [
                EvaluationRun(evaluation=evaluation, run=next(runs), side=side, item=item.id)
                for item, _ in tasks
                for side, _ in sides
            ]
        )
        event_record(
            actor=actor,
            action=Action.EVALUATION_STARTED,
            obj=evaluation,
            payload={
                "candidate": candidate.name,
                "baseline": baseline.name,
                "split": split,
                "items": len(found),
            },
        )
    return evaluation


def _p95(values: list[float]) -> float | None:
    """The 95th percentile with linear interpolation: PostgreSQL's percentile_cont, as the ops page
    computes it (routing.ops.Percentile)."""
    if not values:
        return None
    if len(values) == 1:
        return round(float(values[0]), 1)
    return round(statistics.quantiles(values, n=20, method="inclusive")[-1], 1)


def evaluation_summary(evaluation: Evaluation) -> dict[str, dict[str, Any]]:
    """Per side: accuracy (a failed run counts as wrong), USD per 1,000 tasks, p95 plan latency.

    While runs are still going, every figure is over the runs that have ended: `n` is how many that
    is (the items scored so far), `total` how many the side has in all; done when n == total.
    """
    results: dict[str, dict[str, Any]] = {}
    links = EvaluationRun.objects.filter(evaluation=evaluation).select_related("run")
    plan_ms: dict[int, float] = {}
    for run_id, latency in Decision.objects.filter(
        run__evaluation_run__evaluation=evaluation, depth=0
    ).values_list("run_id", "latency_ms"):
        plan_ms[run_id] = plan_ms.get(run_id, 0) + latency
    for side, version in (("candidate", evaluation.candidate), ("baseline", evaluation.baseline)):
        runs = [link.run for link in links if link.side == side]
        finished = [r for r in runs if r.status in FINISHED_RUN]
        cost = sum((r.cost_usd for r in finished), Decimal("0"))
        results[side] = {
            "version": version.name,
            "n": len(finished),
            "total": len(runs),
            "finished": len(finished),
            "failed": sum(r.status == RunStatus.FAILED for r in finished),
            "accuracy": round(sum(r.score or 0.0 for r in finished) / len(finished), 4) if finished else None,
            "usd_per_1000": str((cost / len(finished) * 1000).quantize(Decimal("0.0001")))
            if finished
            else None,
            "p95_plan_ms": _p95([plan_ms[r.pk] for r in finished if r.pk in plan_ms]),
        }
    return results


def evaluation_refresh(evaluation: Evaluation) -> Evaluation:
    """Recompute the results; the first time every run has ended, the evaluation finishes (audited)."""
    results = evaluation_summary(evaluation)
    done = all(side["finished"] == side["total"] for side in results.values())
    with transaction.atomic():
        locked = Evaluation.objects.select_for_update().get(pk=evaluation.pk)
        locked.results = results
        fields = ["results"]
        if done and locked.status == JobStatus.RUNNING:
            locked.status, locked.finished_at = JobStatus.SUCCEEDED, timezone.now()
            fields += ["status", "finished_at"]
            event_record(
                actor=Actor.service("training"),
                action=Action.EVALUATION_FINISHED,
                obj=locked,
                payload=results,
            )
        locked.save(update_fields=fields)
    return locked


# --- promotion, rollback, shadow ----------------------------------------------------------------


def _lora_load(version: ConductorVersion) -> dict[str, Any] | None:
    """For an LLM conductor with an adapter: load it into the vLLM server (POST /v1/load_lora_adapter)."""
    import httpx

    config = version.config
    if version.backend != ConductorVersion.Backend.LLM or not config.get("lora_path"):
        return None
    base = str(config.get("api_base") or "").rstrip("/")
    if not base:
        raise TrainingError(f"{version.name} has a LoRA adapter but no api_base to load it into")
    url = (base if base.endswith("/v1") else base + "/v1") + "/load_lora_adapter"
    body = {"lora_name": config.get("lora_name") or version.name, "lora_path": config["lora_path"]}
    try:
        response = httpx.post(url, json=body, timeout=settings.CONDUCTOR_PROVIDER_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise TrainingError(redact(f"could not reach the vLLM server at {url}: {exc}")) from exc
    if response.status_code >= 400 and "already been loaded" not in response.text:  # its text is the server's
        raise TrainingError(
            redact(f"vLLM refused the adapter ({response.status_code}): {response.text[:300]}")
        )
    return {"url": url, **body, "status": response.status_code}


def _activation_load(version: ConductorVersion, actor: Actor) -> dict[str, Any] | None:
    """Load the adapter of a version about to become active; a refusal is recorded, and nothing changes."""
    try:
        return _lora_load(version)
    except TrainingError as exc:
        with transaction.atomic():
            event_record(
                actor=actor,
                action=Action.CONDUCTOR_PROMOTION_FAILED,
                obj=version,
                payload={"error": str(exc)},
            )
        raise


def conductor_promote(*, version: ConductorVersion, actor: Actor) -> ConductorVersion:
    """Make `version` the conductor that plans the next tasks (loading its adapter first, if any)."""
    if version.is_active:
        raise TrainingError(f"{version.name} is already the active conductor")
    loaded = _activation_load(version, actor)
    try:
        return _promote(version, actor, loaded)
    except IntegrityError as exc:  # another promotion or a shadow change got there first
        raise TrainingError(f"{version.name} changed while being promoted; try again") from exc


def _promote(version: ConductorVersion, actor: Actor, loaded: dict[str, Any] | None) -> ConductorVersion:
    with transaction.atomic():
        previous = ConductorVersion.objects.filter(is_active=True).first()
        _leave_shadow(version, actor)
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_PROMOTED,
            obj=version,
            payload={
                "name": version.name,
                "previous": previous.name if previous else None,
                "adapter": loaded,
            },
        )
        return conductor_activate(version=version, actor=actor)


def conductor_rollback(*, actor: Actor) -> ConductorVersion:
    """Re-activate the version that was active before the current one (read from the audit record)."""
    current = ConductorVersion.objects.filter(is_active=True).first()
    if current is None:
        raise TrainingError("no conductor is active: nothing to roll back")
    last = (
        AuditEvent.objects.filter(
            action=Action.CONDUCTOR_ACTIVATED, object_type="conductorversion", object_id=str(current.pk)
        )
        .order_by("-id")
        .first()
    )
    previous_name = (last.payload or {}).get("previous") if last else None
    previous = ConductorVersion.objects.filter(name=previous_name).first() if previous_name else None
    if previous is None:
        raise TrainingError(f"no earlier conductor to roll back to from {current.name}")
    _activation_load(previous, actor)  # vLLM may have restarted since it last served this adapter
    with transaction.atomic():
        _leave_shadow(previous, actor)
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_ROLLED_BACK,
            obj=previous,
            payload={"from": current.name, "to": previous.name},
        )
        return conductor_activate(version=previous, actor=actor)


def _leave_shadow(version: ConductorVersion, actor: Actor) -> None:
    """A version about to become active stops shadowing (recorded: shadow mode really ends)."""
    if ConductorVersion.objects.filter(pk=version.pk, is_shadow=True).update(is_shadow=False):
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_SHADOW_CLEARED,
            obj=version,
            payload={"shadow": None, "previous": version.name, "reason": "activated"},
        )


def shadow_set(*, version: ConductorVersion | None, actor: Actor) -> None:
    """`version` plans every new live task alongside the active one, without affecting it; None: stop."""
    if version is not None and version.is_active:
        raise TrainingError(f"{version.name} is the active conductor; shadow a candidate instead")
    loaded = _lora_load(version) if version is not None else None  # a shadow LLM needs its adapter served
    try:
        _shadow_switch(version, actor, loaded)
    except IntegrityError as exc:  # the version was promoted meanwhile
        raise TrainingError("the conductors changed meanwhile; reload and try again") from exc


def _shadow_switch(version: ConductorVersion | None, actor: Actor, loaded: dict[str, Any] | None) -> None:
    with transaction.atomic():
        previous = ConductorVersion.objects.select_for_update().filter(is_shadow=True).first()
        if version is None and previous is None:
            return  # nothing shadows: nothing to clear
        ConductorVersion.objects.filter(is_shadow=True).update(is_shadow=False)
        if version is not None:
            ConductorVersion.objects.filter(pk=version.pk).update(is_shadow=True)
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_SHADOW_SET if version else Action.CONDUCTOR_SHADOW_CLEARED,
            obj=version or previous,
            payload={
                "shadow": version.name if version else None,
                "previous": previous.name if previous else None,
                "adapter": loaded,
            },
        )


def _user(user: Any) -> Any:
    return user if getattr(user, "is_authenticated", False) else None
