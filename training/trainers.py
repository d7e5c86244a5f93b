"""Training jobs as they run: start, progress (the curves), the two trainers (the learned policy's
GRPO, TRL's GRPO with LoRA), registering the candidate, and how a job ends. The Celery task that
calls it (one process per job, under the job's lock) is training.tasks.train_job."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Concat
from django.utils import timezone

from audit.actions import Action
from audit.services import event_record
from audit.templatetags.display import plain, settings_text
from routing import replay
from routing.engine.planning import screened_workers
from routing.local_pool import MAX_PLAN_STEPS, MAX_TEXT_CHARS, conductor_config, local_api_base
from routing.models import CONDUCTOR_SLUG, ConductorVersion, Task
from routing.plans import workflow_schema
from routing.secrets import redact

from .engine_reward import EngineReward
from .frontier import COST_PENALTIES, REFINE, Fit, gate_policy, sweep
from .itemsets.selectors import REPLAY_SET, SEPARATOR, SetItem, is_replay, resolve, split_ids, with_outcomes
from .local_base import is_local_base, local_base_export
from .lora import run_grpo_lora
from .models import JobStatus, TrainingJob, TrainingMetric
from .policy import GRPOConfig, Policy, Workflow, default_actions, outcome_table, train
from .services import dataset_files, replay_items
from .services.common import SERVICE

log = logging.getLogger(__name__)


class Cancelled(Exception):
    pass


class NothingTrained(Exception):
    """The trainer returned without taking a single optimizer step: there is nothing to register."""


def run_job(job_id: int) -> None:
    """Train one job (its process holds the job's lock): start it (again, if its process was lost),
    train with its backend, register the candidate, or record why it failed or stopped."""
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
        job.step, job.phase = 0, ""
        job.save(
            update_fields=["status", "started_at", "deliveries", "worker_host", "worker_pid", "step", "phase"]
        )
        event_record(
            actor=SERVICE,
            action=Action.TRAINING_JOB_RESTARTED if restarted else Action.TRAINING_JOB_RUNNING,
            obj=job,
            payload={"backend": job.backend, "delivery": job.deliveries, "worker_pid": job.worker_pid},
        )
    if restarted:
        _log(job, "restarted from the beginning: the process training it was lost")
    _log(job, f"started ({job.backend}) with {settings_text(job.options)}")
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
            phase="",
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
            status=status,
            finished_at=timezone.now(),
            error="" if status == JobStatus.CANCELLED else message,
            phase="",
        )
        event_record(actor=SERVICE, action=action, obj=job, payload={"message": message})
    _log(job, message)


def _log(job: TrainingJob, line: str) -> None:
    stamp = timezone.now().strftime("%H:%M:%S")
    TrainingJob.objects.filter(pk=job.pk).update(log=Concat("log", Value(f"{stamp} {line}\n")))


def _phase(job: TrainingJob, phase: str) -> None:
    """Say what the job does after its last step (the job's page shows it while it runs)."""
    TrainingJob.objects.filter(pk=job.pk).update(phase=phase)


def _progress(job: TrainingJob, step: int, total: int, values: dict[str, Any]) -> bool:
    """Record one point of the curves; stop if the job was cancelled. True: go on."""
    numeric = {k: float(v) for k, v in values.items() if isinstance(v, int | float) and v == v}
    TrainingMetric.objects.create(job=job, step=step, values=numeric)
    TrainingJob.objects.filter(pk=job.pk).update(step=step, total_steps=total)
    if TrainingJob.objects.filter(pk=job.pk, cancel_requested=True).exists():
        raise Cancelled
    return True


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON Lines file. Lines end at "\n" only: a text may hold U+2028 or another
    character str.splitlines() would also break at, written as is (JSON allows it unescaped)."""
    with path.open(encoding="utf-8", newline="\n") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _job_items(job: TrainingJob) -> tuple[list[Any], list[str]]:
    """What a learned job trains on, with each worker's outcome on every item, and the workers its
    workflows may use: a dataset's training rows, or a set's split (the version the job froze). The
    replay files record the benchmark's outcomes; a team's items take theirs from the record (their
    rollouts: a survey, or any plan whose steps answered alone), as training.itemsets.selectors says."""
    if job.dataset is not None:
        rows = jsonl_rows(dataset_files(job.dataset)["train.jsonl"])
        if all(SEPARATOR not in str(row["item"]) for row in rows):
            items = replay_items([row["item"] for row in rows])
            return items, sorted(items[0].outcomes) if items else []
        firsts = list({row["item"]: row for row in rows}.values())
        tasks = Task.objects.in_bulk([row["task_id"] for row in firsts])
        own = [_dataset_item(row, tasks[uuid.UUID(str(row["task_id"]))]) for row in firsts]
        return with_outcomes(own, run_ids=list(job.dataset.source_run_ids))
    item_set = job.options.get("item_set") or REPLAY_SET
    if is_replay(item_set):
        items = replay.read_items(replay.split_path(job.options["split"]))
        items = items[: job.options["limit"]] if job.options.get("limit") else items
        return items, sorted(items[0].outcomes) if items else []
    version = job.options.get("item_set_version")
    ids = sorted(split_ids(item_set, job.options["split"], version=version))
    ids = ids[: job.options["limit"]] if job.options.get("limit") else ids
    return with_outcomes(resolve(item_set, ids, version=version).items)


def _dataset_item(row: dict[str, Any], task: Task) -> SetItem:
    """A team's item as a dataset's row names it, with its training task's words."""
    return SetItem(
        id=str(row["item"]),
        task=task.text,
        reference=task.reference,
        domain=task.domain,
        scorer=task.scorer,
        classification=task.classification,
        split="train",
    )


def _train_learned(job: TrainingJob) -> tuple[Path, dict[str, Any], str]:

    items, workers = _job_items(job)
    if not items or not workers:
        raise ValueError(
            "no items with every worker's answer to train on: a team's items need rollouts first "
            "(a survey, in which every worker answers each item once)"
        )
    o = job.options
    actions = default_actions(workers)
    policy = Policy.for_items(actions, items)
    kinds = ", ".join(f"{k} ({policy.scorers[k]})" for k in policy.kinds) or "none: text only"
    _log(job, f"{len(items)} items, {len(policy.actions)} workflows, {o['epochs']} epochs; kinds: {kinds}")
    config = GRPOConfig(
        group_size=o["group_size"],
        epochs=o["epochs"],
        learning_rate=o["learning_rate"],
        cost_penalty_per_usd=o["cost_penalty_per_usd"],
    )
    table = outcome_table(actions, items, policy.scorers)

    def on_epoch(epoch: int, mean_reward: float) -> None:
        chosen = [actions.index(policy.choose(item.task, item.domain)[0]) for item in items]
        rows = range(len(items))
        accuracy = float(table.correct[rows, chosen].mean())
        usd_per_1000 = float(table.cost[rows, chosen].mean()) * 1000
        _progress(
            job,
            epoch,
            o["epochs"],
            {"reward": mean_reward, "accuracy": accuracy, "usd_per_1000": usd_per_1000},
        )

    curve = train(policy, items, config, on_epoch=on_epoch, table=table)
    if not curve:
        raise NothingTrained("the policy trained for 0 epochs: nothing was registered")
    fit = _cross_validate(job, actions, items, config)
    _phase(job, "gating: choosing each kind's fallback workflow")
    gate_policy(policy, items, fit)
    fallback = {k: actions[i].name for k, i in policy.fallback.items()}
    on_frontier = ", ".join(f"{p.cost_penalty_per_usd:g}" for p in fit.frontier)
    _log(job, f"frontier (cross-validated): penalties {on_frontier}; falls back to {plain(fallback)}")
    first, last = curve[0], curve[-1]
    _phase(job, "writing the policy and registering the candidate")
    path = _artifact_dir(job, "policies") / "policy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(policy.to_json())
    config_out = {
        "policy_path": str(path),
        "items": len(items),
        **{k: o[k] for k in ("epochs", "learning_rate", "cost_penalty_per_usd")},
        "kinds": policy.kinds,
        "fallback": fallback,
        "frontier": policy.frontier,
    }
    return path, config_out, f"GRPO on {len(items)} items; mean reward {first:.3f} -> {last:.3f}"


def _cross_validate(job: TrainingJob, actions: list[Workflow], items: list[Any], config: GRPOConfig) -> Fit:
    """training.frontier's sweep at the job's penalty (and the grid's, with `frontier`), its progress
    said on the job's page and in its log."""
    o = job.options
    folds = o["folds"]
    penalties = (
        sorted({*COST_PENALTIES, config.cost_penalty_per_usd})
        if o["frontier"]
        else [config.cost_penalty_per_usd]
    )
    _log(
        job,
        f"cross-validating: {len(penalties)} cost penalties"
        + (f" and up to {REFINE} more where the curve has gaps" if o["frontier"] else "")
        + f" x {folds} folds",
    )
    _phase(job, "cross-validating the cost penalties")

    def on_fold(done: int, total: int) -> None:
        if TrainingJob.objects.filter(pk=job.pk, cancel_requested=True).exists():
            raise Cancelled
        _phase(job, f"cross-validating the cost penalties: {done} of up to {total} trainings")
        if done % folds == 0:
            _log(job, f"cross-validated {done // folds} of up to {total // folds} cost penalties")

    return sweep(
        actions,
        items,
        lambda: Policy.for_items(actions, items),
        config,
        penalties=penalties,
        folds=folds,
        on_fold=on_fold,
    )


def _train_lora(job: TrainingJob) -> tuple[Path, dict[str, Any], str]:
    import datasets  # Hugging Face datasets: heavy; imported only when a job trains

    if job.dataset is None:  # the service refuses a LoRA job without one
        raise ValueError("a LoRA job trains on a dataset, and this one has none")
    files = dataset_files(job.dataset)
    data = datasets.load_dataset("parquet", data_files={"train": str(files["train.parquet"])})["train"]
    o = job.options
    out = _artifact_dir(job, "adapters")
    reward = EngineReward(job)
    local = is_local_base(o["base_model_path"])
    if local:
        _log(
            job, "base: the local model, SmolLM2-135M-Instruct (its checkpoint made from its GGUF file once)"
        )
        local_base_export()
    _log(job, f"{len(data)} prompts from {job.dataset}; base model {o['base_model_path']}")
    schema = _served_schema(data) if local else None
    if schema is not None:
        _log(job, "samples drawn under the workflow's JSON schema, as the local model's server writes plans")
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
            "structured_output_schema": schema,
            **(
                {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": o["vllm_server_base_url"]}
                if o.get("use_vllm")
                else {}
            ),
        },
        on_log=lambda step, total, metrics: _lora_progress(job, step, total, metrics),
    )
    if not result["global_step"]:
        shutil.rmtree(out, ignore_errors=True)  # an untrained adapter is no candidate
        raise NothingTrained(_no_step_reason(len(data), o["prompts_per_step"]))
    adapter = {
        "lora_name": job.name,
        "lora_path": str(result["adapter_dir"]),
        "base_model_path": o["base_model_path"],
    }
    if local:  # served by the local model's server (llama.cpp), as the base model is
        config = {
            **conductor_config(local_api_base()),
            "model": f"openai/{job.name}",
            "serving": "llama.cpp",
            **adapter,
        }
    else:  # served by vLLM, which loads the adapter at run time
        config = {"model": f"hosted_vllm/{job.name}", "api_base": settings.CONDUCTOR_VLLM_API_BASE, **adapter}
    note = f"TRL GRPO + LoRA (r={o['lora_r']}) for {result['global_step']} steps on {job.dataset}"
    return Path(result["adapter_dir"]), config, note


def _no_step_reason(prompts: int, prompts_per_step: int) -> str:
    """Why a LoRA job took 0 optimizer steps (TRL: "not a single sample in your epoch_iterator"), said on
    its page: the job fails, and no version is registered."""
    why = (
        f"the dataset's {prompts} training prompts are fewer than the {prompts_per_step} a step takes"
        if prompts < prompts_per_step
        else "the trainer found no batch to train on"
    )
    return f"the trainer took 0 optimizer steps ({why}): nothing was trained, so nothing was registered"


def _lora_progress(job: TrainingJob, step: int, total: int, metrics: dict[str, Any]) -> bool:
    """A LoRA step's point; after the last one the trainer saves the adapter before it returns."""
    going = _progress(job, step, total, metrics)
    if total and step >= total:
        _phase(job, "saving the adapter and registering the candidate")
    return going


def _served_schema(data: Any) -> dict[str, Any]:
    """The schema the local model's server writes plans under (its conductor's caps), over the workers
    the dataset's tasks may go to today (what their plans are executed with): what a sample of the
    trained adapter will be held to when it serves."""
    tasks = Task.objects.filter(pk__in=set(data["task_id"]))
    slugs = {worker.slug for task in tasks for worker in screened_workers(task)[0]}
    if any(task.max_depth > 0 for task in tasks):  # the prompt offers the conductor as a step (recursion)
        slugs.add(CONDUCTOR_SLUG)
    return workflow_schema(
        sorted(slugs),
        max_steps=MAX_PLAN_STEPS,
        min_steps=1,
        max_text_chars=MAX_TEXT_CHARS,
    )


def _cuda() -> bool:
    import torch  # torch: heavy; imported only when a job trains

    return torch.cuda.is_available()
