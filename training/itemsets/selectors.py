"""Reading item sets: the items of a set's split, as rollouts, evaluations and jobs take them, and what
each worker answered on them, from the record.

The bundled replay benchmark is the set named REPLAY_SET: its items are read in place from the replay
files (routing.replay), its splits are the files'. Every other set is rows (training.models.Item) of
its latest version; an item is named `<set>/<key>` wherever a rollout, a dataset or an evaluation
refers to it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from django.db.models import Exists, OuterRef, Q
from django.http import QueryDict

from operations.tasks.filters import TaskFilter
from routing import replay
from routing.models import Annotation, DataClass, RunStatus, SavedView, Step, StepStatus, Task
from routing.scoring.scorers import score
from routing.selectors import task_list
from training.quotas import MAX_ITEMS

from ..errors import TrainingError
from ..models import Item, ItemSet, ItemSetVersion, ItemSplit
from .rows import MAX_ROWS

REPLAY_SET = "replay"  # the bundled benchmark (the demo's set), read in place
SEPARATOR = "/"  # between a set's name and an item's key


@dataclass(frozen=True)
class SetItem:
    """An item of a team's set as the training loop reads it (a replay item has the same fields)."""

    id: str
    task: str
    reference: str | None
    domain: str  # the set's kind label: the learned policy's kind
    scorer: str
    classification: str
    split: str
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, item: Item, set_name: str) -> SetItem:
        return cls(
            id=f"{set_name}{SEPARATOR}{item.key}",
            task=item.text,
            reference=item.reference,
            domain=item.kind,
            scorer=item.scorer,
            classification=item.classification,
            split=item.split,
        )


@dataclass(frozen=True)
class Resolved:
    """The items a request names, and the version of the set they were read from (None: replay)."""

    item_set: str
    version: ItemSetVersion | None
    items: list[Any]


def is_replay(item_set: str) -> bool:
    return item_set in ("", REPLAY_SET)


def set_names() -> list[str]:
    """Every set a form offers: the team's, then the bundled benchmark."""
    return [*ItemSet.objects.order_by("name").values_list("name", flat=True), REPLAY_SET]


def latest_version(item_set: str) -> ItemSetVersion:
    version = (
        ItemSetVersion.objects.filter(item_set__name=item_set)
        .select_related("item_set")
        .order_by("-number")
        .first()
    )
    if version is None:
        raise TrainingError(f"there is no item set {item_set!r}")
    return version


def version_of(item_set: str, number: int | None) -> ItemSetVersion:
    if number is None:
        return latest_version(item_set)
    version = (
        ItemSetVersion.objects.filter(item_set__name=item_set, number=number)
        .select_related("item_set")
        .first()
    )
    if version is None:
        raise TrainingError(f"the item set {item_set!r} has no version {number}")
    return version


def split_ids(
    item_set: str, split: str, limit: int | None = None, kind: str = "", version: int | None = None
) -> list[str]:
    """The ids of a split's items, in a fixed shuffled order (kinds mixed), optionally of one kind."""
    if is_replay(item_set):
        try:
            items = replay.read_items(replay.split_path(split))
        except replay.ReplayDataError as exc:
            raise TrainingError(str(exc)) from exc
        ids = [item.id for item in items if not kind or item.domain == kind]
    else:
        if split not in ItemSplit.values:
            raise TrainingError(f"{split!r} is not a split; one of {', '.join(ItemSplit.values)}")
        found = version_of(item_set, version)
        rows = found.items.filter(split=split, purged_at__isnull=True).order_by("key")
        if kind:
            rows = rows.filter(kind=kind)
        ids = [f"{item_set}{SEPARATOR}{key}" for key in rows.values_list("key", flat=True)]
    if not ids:
        raise TrainingError(
            f"no items in the {split} split of {item_set}" + (f" of kind {kind!r}" if kind else "")
        )
    random.Random(0).shuffle(ids)
    return ids[:limit] if limit else ids


def resolve(item_set: str, ids: list[str], version: int | None = None) -> Resolved:
    """The items named by `ids` (each once, in order), from the set's version (its latest by default);
    TrainingError names those that are not there."""
    if not ids:
        raise TrainingError("choose at least one item")
    if len(ids) > MAX_ITEMS:
        raise TrainingError(f"{len(ids)} items; at most {MAX_ITEMS} at once")
    ids = list(dict.fromkeys(ids))
    if is_replay(item_set):
        return Resolved(REPLAY_SET, None, _replay_items(ids))
    found_version = version_of(item_set, version)
    prefix = f"{item_set}{SEPARATOR}"
    keys = [i[len(prefix) :] if i.startswith(prefix) else i for i in ids]
    rows = {row.key: row for row in found_version.items.filter(key__in=keys, purged_at__isnull=True)}
    missing = [key for key in keys if key not in rows]
    if missing:
        raise TrainingError(f"not in {found_version}: {', '.join(missing[:5])}")
    return Resolved(item_set, found_version, [SetItem.of(rows[key], item_set) for key in keys])


def _replay_items(item_ids: list[str]) -> list[replay.ReplayItem]:
    found: list[replay.ReplayItem] = []
    missing: list[Any] = []
    for item_id in item_ids:
        try:
            item = replay.find_item(item_id=item_id, texts=[])
        except replay.ReplayDataError as exc:
            raise TrainingError(str(exc)) from exc
        if item is not None and item.id == item_id:
            found.append(item)
        else:
            missing.append(item_id)
    if missing:
        raise TrainingError(f"unknown items: {', '.join(map(str, missing[:5]))}")
    return found


# --- Each worker's answer on an item, from the record ---------------------------------------------


def with_outcomes(items: list[SetItem], run_ids: list[int] | None = None) -> tuple[list[SetItem], list[str]]:
    """The items with what each worker answered them, as a learned policy trains on (the replay files
    record the same for the benchmark): from every finished top-level step that saw no other step
    (access []) of a training run of the item's task, the newest per worker; its answer scored by the
    item's scorer (the run's own score where the step was the whole plan, as a judge or a reviewer
    graded it), its cost the step's. `run_ids`: only those runs (a dataset's).

    Returns the items and the workers every one of them has an answer from (the workflows a policy may
    use); an item with no answer at all is left out."""
    by_id = {item.id: item for item in items}
    steps = Step.objects.filter(
        run__task__source=Task.Source.TRAINING,
        run__task__source_item__in=list(by_id),
        run__status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED],
        depth=0,
        status=StepStatus.SUCCEEDED,
        access=[],
    ).exclude(worker_slug="conductor")
    if run_ids is not None:
        steps = steps.filter(run_id__in=run_ids)
    rows = list(
        steps.order_by("run_id", "index").values_list(
            "run__task__source_item", "worker_slug", "response", "cost_usd", "run_id", "run__score"
        )
    )
    single = _single_step_runs([r[4] for r in rows])
    answers: dict[str, dict[str, dict[str, Any]]] = {}
    for item_id, worker, response, cost, run_id, run_score in rows:
        item = by_id[item_id]
        graded, answer = score(
            response=response,
            reference=item.reference or "",
            scorer=_rule_scorer(item.scorer),
            domain=item.domain,
        )
        if run_id in single and run_score is not None:
            graded = float(run_score)
        elif item.reference is None:
            continue  # nothing to grade it by
        answers.setdefault(item_id, {})[worker] = {
            "response": response,
            "answer": answer,
            "score": graded,
            "cost_usd": float(Decimal(cost)),
        }
    kept = [replace(item, outcomes=answers[item.id]) for item in items if answers.get(item.id)]
    workers = sorted(set.intersection(*(set(i.outcomes) for i in kept))) if kept else []
    return kept, workers


def _single_step_runs(run_ids: list[int]) -> set[int]:
    """Those of the runs whose whole work was one step (the run's score is that step's)."""
    counted: dict[int, int] = {}
    for run_id in Step.objects.filter(run_id__in=set(run_ids)).values_list("run_id", flat=True):
        counted[run_id] = counted.get(run_id, 0) + 1
    return {run_id for run_id, n in counted.items() if n == 1}


def _rule_scorer(scorer: str) -> str:
    """The scorer that grades an answer here: a judge's or a reviewer's verdict is the run's, so a step
    among others is compared exactly."""
    return "exact" if scorer in ("judge", "human") else scorer


def task_scorer(scorer: str) -> str:
    """The scorer a training task of the item is graded by in the engine (a reviewer's verdict comes
    later, through review: the reference, when the verdict gave one, is matched exactly)."""
    return "exact" if scorer == "human" else scorer


def classification_of(item: Any) -> str:
    """An item's data class; a replay item is public (the benchmarks are published)."""
    return str(getattr(item, "classification", "") or DataClass.PUBLIC)


def view_tasks(view: SavedView) -> list[Task]:
    """The tasks a saved view of the task list selects (its filters, as the list applies them) that
    can become items: a reference, or a reviewer's verdict on one of their runs; at most MAX_ROWS."""
    listed = TaskFilter(QueryDict(view.query), task_list()).qs.exclude(source=Task.Source.TRAINING)
    usable = Q(reference__isnull=False) & ~Q(reference="") | Exists(
        Annotation.objects.filter(run__task=OuterRef("pk"), step__isnull=True)
    )
    return list(listed.filter(usable, purged_at__isnull=True).order_by("created_at")[:MAX_ROWS])
