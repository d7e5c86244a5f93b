"""GRPO datasets built from finished rollouts: groups, rewards, advantages, files (Parquet and
JSON Lines) and their manifest.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, Max, OuterRef, QuerySet
from django.db.models.functions import Coalesce

from audit.actions import Action
from audit.services import Actor, event_record
from review.annotations import services as review
from routing.limits import name_check
from routing.models import Annotation, ConductorVersion

from ..models import Dataset, Rollout
from ..rewards import RewardConfig
from .common import FINISHED_RUN, TrainingError, check_or_refuse, user_of
from .dataset_groups import Built, collector_paused, groups_stream
from .dataset_writer import GroupFiles

DATASET_LOCK_NAMESPACE = 0x44617461  # "Data": one build of a dataset name at a time


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
    rollouts = _rollouts_selected(selection, conductor_version, human_labels=reward_config.human_labels)
    with transaction.atomic():
        # One build of a name at a time: the next version number is read under this lock.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [DATASET_LOCK_NAMESPACE, name])
        version = (Dataset.objects.filter(name=name).aggregate(v=Max("version"))["v"] or 0) + 1
        relative = Path("datasets") / name / f"v{version}"
        directory = settings.VAR_DIR / relative
        if directory.exists():
            raise TrainingError(f"{relative} exists but no dataset names it; move it away first")
        try:
            with collector_paused(), GroupFiles(directory) as files:
                built = groups_stream(
                    rollouts,
                    files,
                    reward_config,
                    min_group_size=min_group_size,
                    validation=validation_fraction,
                )
            if not built.kept:
                raise TrainingError(
                    f"no group of at least {min_group_size} finished rollouts matches the filter "
                    f"({built.groups} smaller groups, {built.ungraded} ungraded samples left out)"
                )
            dataset = _dataset_record(
                name=name,
                selection=selection,
                version=version,
                relative=relative,
                directory=directory,
                reward_config=reward_config,
                files=files,
                built=built,
                rollouts=rollouts,
                actor=actor,
                user=user,
            )
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)  # this build made it: nothing half-written stays
            raise
    return dataset


def _rollouts_selected(
    selection: DatasetFilter, conductor_version: ConductorVersion | None, *, human_labels: bool
) -> QuerySet[Rollout]:
    """The finished rollouts that match the filter, each with the correctness it is rewarded for
    (`score_used`): its score, or a reviewer's verdict where there is one and the rewards take them."""
    rollouts = Rollout.objects.filter(run__status__in=FINISHED_RUN).select_related("run", "task")
    if selection.batch_ids:
        rollouts = rollouts.filter(batch_id__in=selection.batch_ids)
    if conductor_version is not None:
        # A trainer's samples are the plans of the model being trained, whatever version ran them.
        rollouts = rollouts.filter(run__conductor_version=conductor_version, batch__training_job__isnull=True)
    if selection.since:
        rollouts = rollouts.filter(run__created_at__gte=selection.since)
    if selection.until:
        rollouts = rollouts.filter(run__created_at__lt=selection.until)
    if selection.items:
        rollouts = rollouts.filter(item__in=selection.items)
    human = review.human_score(run=OuterRef("run_id"))
    return rollouts.annotate(score_used=Coalesce(human, F("run__score")) if human_labels else F("run__score"))


def _dataset_record(
    *,
    name: str,
    selection: DatasetFilter,
    version: int,
    relative: Path,
    directory: Path,
    reward_config: RewardConfig,
    files: GroupFiles,
    built: Built,
    rollouts: QuerySet[Rollout],
    actor: Actor,
    user: Any,
) -> Dataset:
    """The dataset's row, its source runs, its manifest and its audit event, once its files are written."""
    counts = {
        "groups": built.kept,
        # A group whose samples all earned the same reward has advantage 0 everywhere: GRPO
        # learns nothing from it. How many can teach, and how far rewards spread within a group.
        "groups_with_signal": built.with_signal,
        "reward_spread_mean": round(built.spread_sum / built.kept, 6),
        "train": files.rows["train"],
        "validation": files.rows["validation"],
        "completions": len(built.run_ids),
        "skipped_groups": built.groups - built.kept,
        "ungraded_samples": built.ungraded,
    }
    if reward_config.human_labels:
        human_labelled = Annotation.objects.filter(run=OuterRef("run_id"), step__isnull=True)
        counts["human_labels"] = rollouts.filter(Exists(human_labelled)).count()
    dataset = Dataset.objects.create(
        name=name,
        version=version,
        filter=selection.as_dict(),
        reward_config=reward_config.as_dict(),
        counts=counts,
        content_hash=files.content_hash(),
        path=str(relative),
        created_by=user_of(user),
    )
    dataset.source_run_ids = _source_runs_save(dataset, built.run_ids)
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
            "content_hash": dataset.content_hash,
            "source_runs": len(built.run_ids),
        },
    )
    return dataset


def _source_runs_save(dataset: Dataset, run_ids: list[int]) -> list[int]:
    """Store the dataset's run ids, sorted, as one array literal (a build may have hundreds of
    thousands: the ORM would prepare each id on its own)."""
    ordered = sorted(run_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE training_dataset SET source_run_ids = %s::bigint[] WHERE id = %s",
            ["{" + ",".join(map(str, ordered)) + "}", dataset.pk],
        )
    return ordered


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
