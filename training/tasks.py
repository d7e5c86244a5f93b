"""Celery tasks of the training queue: training jobs, and settling rollout batches and evaluations."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Concat
from django.utils import timezone

from audit.actions import Action
from audit.services import Actor, event_record
from routing import replay
from routing.models import ConductorVersion, Run
from routing.secrets import redact

from .models import Evaluation, JobStatus, RolloutBatch, TrainingJob, TrainingMetric

log = logging.getLogger(__name__)
SERVICE = Actor.service("training")


class Cancelled(Exception):
    pass


JOB_LOCK_NAMESPACE = 0x54726E67  # "Trng": one process trains a job at a time


@shared_task(name="training.tasks.train_job", acks_late=True, reject_on_worker_lost=True)
def train_job(job_id: int) -> None:
    """Train one job. The job's advisory lock keeps a second delivery out while one process trains it; a
    job whose process died (lock free, still running) starts again from the beginning on redelivery."""
    from routing.engine import advisory_lock

    with advisory_lock(JOB_LOCK_NAMESPACE, job_id) as acquired:
        if acquired:
            _train_job(job_id)


def job_is_locked(job_id: int) -> bool:
    from routing.engine import advisory_locked

    return advisory_locked(JOB_LOCK_NAMESPACE, job_id)


def _train_job(job_id: int) -> None:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
            return  # cancelled before it started, or finished
        if job.cancel_requested:  # cancelled while its lost process was being replaced
            job.status, job.finished_at = JobStatus.CANCELLED, timezone.now()
            job.save(update_fields=["status", "finished_at"])
            event_record(
                actor=SERVICE,
                action=Action.TRAINING_JOB_CANCELLED,
                obj=job,
                payload={"message": "not restarted"},
            )
            return
        restarted = job.status == JobStatus.RUNNING
        if restarted:
            TrainingMetric.objects.filter(job=job).delete()  # the curves start again with the job
        job.status, job.started_at = JobStatus.RUNNING, job.started_at or timezone.now()
        job.deliveries += 1
        job.worker_host, job.worker_pid = socket.gethostname(), os.getpid()
        job.step = 0
        job.save(update_fields=["status", "started_at", "deliveries", "worker_host", "worker_pid", "step"])
        event_record(
            actor=SERVICE,
            action=Action.TRAINING_JOB_RESTARTED if restarted else Action.TRAINING_JOB_RUNNING,
            obj=job,
            payload={"backend": job.backend, "delivery": job.deliveries, "worker_pid": job.worker_pid},
        )
    if restarted:
        _log(job, "restarted from the beginning: the process training it was lost")
    _log(job, f"started ({job.backend}) with {job.options}")
    try:
        if job.backend == TrainingJob.Backend.LEARNED:
            artifact, config, notes = _train_learned(job)
        else:
            artifact, config, notes = _train_lora(job)
        version = _register(job, artifact, config, notes)
    except Cancelled:
        _finish(
            job, JobStatus.CANCELLED, Action.TRAINING_JOB_CANCELLED, "cancelled at the ML staff's request"
        )
        return
    except Exception as exc:  # a failed job says why and stays failed (settle never restarts it)
        log.exception("training job %s failed", job_id)
        _finish(job, JobStatus.FAILED, Action.TRAINING_JOB_FAILED, redact(f"{type(exc).__name__}: {exc}"))
        return
    _log(job, f"finished: candidate {version.name}, artifact {artifact}")


def _artifact_dir(job: TrainingJob, kind: str) -> Path:
    """Where a job writes: its own directory, so no job overwrites what another registered."""
    return settings.VAR_DIR / kind / f"job-{job.pk}-{job.name}"


def _register(job: TrainingJob, artifact: Path, config: dict[str, Any], notes: str) -> ConductorVersion:
    backend = (
        ConductorVersion.Backend.LEARNED
        if job.backend == TrainingJob.Backend.LEARNED
        else ConductorVersion.Backend.LLM
    )
    with transaction.atomic():
        version = ConductorVersion.objects.create(name=job.name, backend=backend, config=config, notes=notes)
        TrainingJob.objects.filter(pk=job.pk).update(
            status=JobStatus.SUCCEEDED,
            finished_at=timezone.now(),
            candidate=version,
            artifact_path=str(Path(artifact).relative_to(settings.VAR_DIR)),
        )
        event_record(
            actor=SERVICE,
            action=Action.CONDUCTORVERSION_REGISTERED,
            obj=version,
            payload={"backend": backend, "training_job": job.pk, "notes": notes},
        )
        event_record(
            actor=SERVICE,
            action=Action.TRAINING_JOB_SUCCEEDED,
            obj=job,
            payload={"candidate": version.name, "artifact": str(artifact)},
        )
    return version


def _finish(job: TrainingJob, status: str, action: str, message: str) -> None:
    with transaction.atomic():
        TrainingJob.objects.filter(pk=job.pk).update(
            status=status, finished_at=timezone.now(), error="" if status == JobStatus.CANCELLED else message
        )
        event_record(actor=SERVICE, action=action, obj=job, payload={"message": message})
    _log(job, message)


def _log(job: TrainingJob, line: str) -> None:
    stamp = timezone.now().strftime("%H:%M:%S")
    TrainingJob.objects.filter(pk=job.pk).update(log=Concat("log", Value(f"{stamp} {line}\n")))


def _progress(job: TrainingJob, step: int, total: int, values: dict[str, Any]) -> None:
    """Record one point of the curves; stop if the job was cancelled."""
    numeric = {k: float(v) for k, v in values.items() if isinstance(v, int | float) and v == v}
    TrainingMetric.objects.create(job=job, step=step, values=numeric)
    TrainingJob.objects.filter(pk=job.pk).update(step=step, total_steps=total)
    if TrainingJob.objects.filter(pk=job.pk, cancel_requested=True).exists():
        raise Cancelled


def _job_items(job: TrainingJob) -> list[replay.ReplayItem]:
    from .services import dataset_files, replay_items

    if job.dataset is not None:
        path = dataset_files(job.dataset)["train.jsonl"]
        return replay_items(
            [json.loads(line)["item"] for line in path.read_text().splitlines() if line.strip()]
        )
    items = replay.read_items(replay.split_path(job.options["split"]))
    return items[: job.options["limit"]] if job.options.get("limit") else items


def _train_learned(job: TrainingJob) -> tuple[Path, dict[str, Any], str]:
    from .policy import GRPOConfig, Policy, default_actions, simulate, train

    items = _job_items(job)
    if not items:
        raise ValueError("no recorded items to train on")
    o = job.options
    policy = Policy.new(default_actions(sorted(items[0].outcomes)))
    _log(job, f"{len(items)} items, {len(policy.actions)} workflows, {o['epochs']} epochs")

    def on_epoch(epoch: int, mean_reward: float) -> None:
        outcomes = [
            simulate(policy.choose(item.task, item.domain)[0], item.outcomes, item.domain) for item in items
        ]
        accuracy = sum(x.correct for x in outcomes) / len(outcomes)
        usd_per_1000 = sum(x.cost_usd for x in outcomes) / len(outcomes) * 1000
        _progress(
            job,
            epoch,
            o["epochs"],
            {"reward": mean_reward, "accuracy": accuracy, "usd_per_1000": usd_per_1000},
        )

    curve = train(
        policy,
        items,
        GRPOConfig(
            group_size=o["group_size"],
            epochs=o["epochs"],
            learning_rate=o["learning_rate"],
            cost_penalty_per_usd=o["cost_penalty_per_usd"],
        ),
        on_epoch=on_epoch,
    )
    first, last = curve[0], curve[-1]
    path = _artifact_dir(job, "policies") / "policy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(policy.to_json())
    config = {"policy_path": str(path), "items": len(items), **{k: o[k] for k in ("epochs", "learning_rate")}}
    return path, config, f"GRPO on {len(items)} recorded items; mean reward {first:.3f} -> {last:.3f}"


def _train_lora(job: TrainingJob) -> tuple[Path, dict[str, Any], str]:
    import datasets

    from .lora import run_grpo_lora
    from .services import dataset_files

    files = dataset_files(job.dataset)
    data = datasets.load_dataset("parquet", data_files={"train": str(files["train.parquet"])})["train"]
    o = job.options
    out = _artifact_dir(job, "adapters")
    reward = EngineReward(job)
    _log(job, f"{len(data)} prompts from {job.dataset}; base model {o['base_model_path']}")
    result = run_grpo_lora(
        base_model_path=o["base_model_path"],
        train_dataset=data,
        output_dir=out,
        reward_funcs=[reward],
        settings={
            "max_steps": o["max_steps"],
            "num_generations": o["num_generations"],
            "prompts_per_step": o["prompts_per_step"],
            "learning_rate": o["learning_rate"],
            "lora_r": o["lora_r"],
            "max_completion_length": o["max_completion_length"],
            "use_cpu": not _cuda(),
            **(
                {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": o["vllm_server_base_url"]}
                if o.get("use_vllm")
                else {}
            ),
        },
        on_log=lambda step, total, metrics: _progress(job, step, total, metrics) or True,
    )
    config = {
        "model": f"hosted_vllm/{job.name}",
        "api_base": settings.CONDUCTOR_VLLM_API_BASE,
        "lora_name": job.name,
        "lora_path": str(result["adapter_dir"]),
        "base_model_path": o["base_model_path"],
    }
    note = f"TRL GRPO + LoRA (r={o['lora_r']}) for {result['global_step']} steps on {job.dataset}"
    return Path(result["adapter_dir"]), config, note


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class EngineReward:
    """A TRL reward function that executes each sampled plan through the engine and scores the run.

    Each completion becomes a rollout run with the plan given as written (an unparseable one fails as an
    invalid plan and earns the format term's 0); the reward follows the job's reward settings.
    """

    __name__ = "engine_reward"

    def __init__(self, job: TrainingJob):
        from .rewards import RewardConfig

        self.job = job
        self.config = RewardConfig(
            cost_penalty_per_usd=job.options.get("cost_penalty_per_usd", 0.0),
            format_term=job.options.get("format_term", True),
        )
        self.batch: RolloutBatch | None = None
        self.samples: dict[str, int] = {}

    def _batch(self, version: ConductorVersion) -> RolloutBatch:
        if self.batch is None:
            with transaction.atomic():
                self.batch = RolloutBatch.objects.create(
                    training_job=self.job,
                    conductor_version=version,
                    k=self.job.options["num_generations"],
                    temperature=1.0,
                    status=JobStatus.RUNNING,
                )
                event_record(
                    actor=SERVICE,
                    action=Action.ROLLOUTS_STARTED,
                    obj=self.batch,
                    payload={
                        "training_job": self.job.pk,
                        "conductor": version.name,
                        "source": "trainer samples",
                    },
                )
        return self.batch

    def __call__(
        self, prompts: list[Any], completions: list[Any], item: list[str] | None = None, **_: Any
    ) -> list[float | None]:
        from routing import engine
        from routing.services import conductor_active

        from .lora import completion_text
        from .models import Rollout
        from .rewards import run_reward
        from .services import item_task

        if item is None:
            raise ValueError(
                "the dataset has no 'item' column: the engine cannot know which task a plan answers"
            )
        version = conductor_active()
        batch = self._batch(version)
        rewards = []
        for text, item_id in zip((completion_text(c) for c in completions), item, strict=True):
            recorded = replay.find_item(item_id=item_id, texts=[])
            if recorded is None:
                raise ValueError(f"unknown item {item_id}")
            with transaction.atomic():
                task = item_task(recorded, SERVICE)
                run = Run.objects.create(
                    task=task,
                    conductor_version=version,
                    kind=Run.Kind.ROLLOUT,
                    plan_override=text if text.strip() else "(no output)",
                )
                sample = self.samples.get(item_id, 0)
                self.samples[item_id] = sample + 1
                Rollout.objects.create(batch=batch, task=task, run=run, item=item_id, sample=sample)
            engine.execute_run(run.pk)
            run.refresh_from_db()
            earned = run_reward(run, self.config)
            # A plan that ran but got no grade (a failed call, no judge) teaches nothing: TRL skips None.
            rewards.append(None if earned.parsed and earned.correct is None else earned.reward)
        return rewards


@shared_task(name="training.tasks.settle")
def settle() -> dict[str, int]:
    """The backstop: mark finished rollout batches and evaluations (done when their last run ends, by
    training.receivers), and queue again the training jobs whose process died."""
    from .services import evaluation_refresh, rollout_batch_refresh

    requeued = 0
    for job_id in TrainingJob.objects.filter(status=JobStatus.RUNNING).values_list("pk", flat=True):
        if not job_is_locked(job_id):  # running, yet no process holds it: its worker died
            log.warning("training job %s lost its process; queueing it again", job_id)
            train_job.delay(job_id)
            requeued += 1
    batches = evaluations = 0
    for batch in RolloutBatch.objects.filter(status=JobStatus.RUNNING)[:100]:
        rollout_batch_refresh(batch)
        batches += 1
    for evaluation in Evaluation.objects.filter(status=JobStatus.RUNNING)[:100]:
        evaluation_refresh(evaluation)
        evaluations += 1
    return {"batches": batches, "evaluations": evaluations, "requeued_jobs": requeued, "at": int(time.time())}
