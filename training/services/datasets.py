"""GRPO datasets built from finished rollouts: groups, rewards, advantages, files (Parquet and
JSON Lines) and their manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max

from audit.actions import Action
from audit.services import Actor, event_record
from routing.conductors import LLMConductor
from routing.engine.planning import plan_request, screened_workers
from routing.limits import name_check
from routing.models import ConductorVersion, Decision, Task

from ..models import Dataset, Rollout
from ..rewards import RewardConfig, RunReward, group_advantages, reward_of
from .common import FINISHED_RUN, TrainingError, check_or_refuse, user_of

DATASET_LOCK_NAMESPACE = 0x44617461  # "Data": one build of a dataset name at a time


def conductor_prompt(task: Task) -> list[dict[str, str]]:
    """The messages an LLM conductor is given for this task with today's pool (the GRPO prompt)."""

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
    check_or_refuse(name_check, name)  # routing.limits.NAME_PATTERN: ASCII only, no look-alikes
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
        spreads = [max(v) - min(v) for v in ([r.reward for _, r in pairs] for pairs in kept.values())]
        counts = {
            "groups": len(kept),
            # A group whose samples all earned the same reward has advantage 0 everywhere: GRPO learns
            # nothing from it. How many can teach, and how far rewards spread within a group.
            "groups_with_signal": sum(spread > 1e-9 for spread in spreads),
            "reward_spread_mean": round(sum(spreads) / len(spreads), 6) if spreads else 0.0,
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
                created_by=user_of(user),
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
    groups: list[dict[str, Any]] = []
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
