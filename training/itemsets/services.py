"""Writes to item sets: an upload, logged tasks added, a version frozen, an item's text purged with its
source task's. Each is one transaction with its audit event (the global chain: human actions)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.roles import recorded_user as user_of
from audit.actions import Action
from audit.services import Actor, event_record
from governance.retention import PURGED
from routing.models import Annotation, Run, RunStatus, Task

from ..errors import TrainingError
from ..models import Item, ItemSet, ItemSetVersion, ItemSplit
from .rows import DEFAULT_KIND, HUMAN, ItemRow
from .selectors import is_replay

# What a split holds of each kind: the train split learns, dev chooses and gates, test is kept back.
SPLIT_SHARES = ((ItemSplit.TRAIN, 0.6), (ItemSplit.DEV, 0.2), (ItemSplit.TEST, 0.2))
EXPORTED_FIELDS = ("id", "text", "reference", "scorer", "kind", "data_class", "split")


def item_line(item: Item) -> str:
    """An item as one line of the set's JSON Lines (the export, and what the content hash covers)."""
    values = (item.key, item.text, item.reference, item.scorer, item.kind, item.classification, item.split)
    return json.dumps(dict(zip(EXPORTED_FIELDS, values, strict=True)), ensure_ascii=False, sort_keys=True)


def version_lines(version: ItemSetVersion) -> Iterable[str]:
    for item in version.items.order_by("key").iterator(chunk_size=500):
        yield item_line(item)


def manifest_of(version: ItemSetVersion) -> dict[str, Any]:
    """The version's manifest: what it holds, per split and kind, and the hash of its lines."""
    digest = hashlib.sha256()
    counts: Counter[str] = Counter()
    for line in version_lines(version):
        digest.update(line.encode() + b"\n")
    for split, kind in version.items.values_list("split", "kind"):
        counts[f"{split}/{kind}"] += 1
    return {
        "item_set": version.item_set.name,
        "version": version.number,
        "items": sum(counts.values()),
        "splits": {s: sum(n for k, n in counts.items() if k.startswith(f"{s}/")) for s in ItemSplit.values},
        "kinds": dict(sorted(counts.items())),
        "content_hash": digest.hexdigest(),
        "format": "one JSON object a line: " + ", ".join(EXPORTED_FIELDS),
    }


def version_freeze(*, version: ItemSetVersion, actor: Actor, why: str) -> ItemSetVersion:
    """Freeze the version before something reads it (a rollout, an evaluation, a dataset, a job, an
    export): its content hash and manifest are written once and audited. Inside the caller's
    transaction; a frozen version is returned as it is."""
    locked = ItemSetVersion.objects.select_for_update().select_related("item_set").get(pk=version.pk)
    if locked.frozen:
        return locked
    locked.manifest = manifest_of(locked)
    locked.content_hash = locked.manifest["content_hash"]
    locked.frozen_at = timezone.now()
    locked.save(update_fields=["manifest", "content_hash", "frozen_at"])
    event_record(
        actor=actor,
        action=Action.ITEMSET_FROZEN,
        obj=locked,
        payload={**locked.manifest, "why": why},
    )
    return locked


@dataclass(frozen=True)
class NewItem:
    """An item to add, however it came (a file's row, a logged task)."""

    key: str
    text: str
    reference: str | None
    scorer: str
    kind: str
    classification: str
    split: str = ""
    origin: str = Item.Origin.FILE
    source_task: Task | None = None
    source_run: Run | None = None
    verdict: str = ""

    @classmethod
    def of_row(cls, row: ItemRow) -> NewItem:
        return cls(row.key, row.text, row.reference, row.scorer, row.kind, row.classification, row.split)


def _writable_version(item_set: ItemSet) -> ItemSetVersion:
    """The set's latest version if it is still open; else its next, with the frozen one's items."""
    latest = ItemSetVersion.objects.select_for_update().filter(item_set=item_set).order_by("-number").first()
    if latest is not None and not latest.frozen:
        return latest
    version = ItemSetVersion.objects.create(item_set=item_set, number=(latest.number + 1) if latest else 1)
    if latest is not None:
        copied = [Item(**{f: getattr(i, f) for f in _COPIED}, version=version) for i in latest.items.all()]
        Item.objects.bulk_create(copied, batch_size=500)
    return version


_COPIED = (
    "key", "text", "reference", "scorer", "kind", "classification", "split", "origin",
    "source_task_id", "source_run_id", "verdict", "added_by_id", "purged_at",
)  # fmt: skip


def assign_splits(new: list[NewItem], existing: Iterable[tuple[str, str]], seed: int) -> list[str]:
    """Each new item's split, once: the one it was given, else by kind, the split furthest below its
    share (SPLIT_SHARES), the kind's items taken in an order seeded by the set. `existing`: the
    (kind, split) of the items the version holds."""
    counts: dict[str, Counter[str]] = {}
    for kind, split in existing:
        counts.setdefault(kind, Counter())[split] += 1
    chosen = {i: item.split for i, item in enumerate(new) if item.split}
    for i, split in chosen.items():
        counts.setdefault(new[i].kind, Counter())[split] += 1
    order = sorted(
        (i for i in range(len(new)) if i not in chosen),
        key=lambda i: (new[i].kind, hashlib.sha256(f"{seed}:{new[i].key}".encode()).hexdigest()),
    )
    for i in order:
        held = counts.setdefault(new[i].kind, Counter())
        n = sum(held.values()) + 1
        split = max(SPLIT_SHARES, key=lambda s: s[1] * n - held[s[0]])[0]
        held[split] += 1
        chosen[i] = split
    return [chosen[i] for i in range(len(new))]


def items_add(
    *,
    name: str,
    new: list[NewItem],
    actor: Actor,
    user: Any = None,
    how: dict[str, Any],
    description: str = "",
) -> tuple[ItemSetVersion, int]:
    """Add items to the set `name` (created when new), in its open version (or the next after a frozen
    one). Refused whole (nothing written) when a key is in the set already. Returns the version and how
    many were added; the event records who, how, and the keys' splits."""
    if is_replay(name):
        raise TrainingError(f"{name!r} is the bundled benchmark; choose another name for your set")
    with transaction.atomic():
        item_set, created = ItemSet.objects.get_or_create(
            name=name, defaults={"description": description, "created_by": user_of(user)}
        )
        version = _writable_version(item_set)
        present = set(version.items.filter(key__in=[i.key for i in new]).values_list("key", flat=True))
        if present:
            raise TrainingError(
                f"already in {item_set.name}: {', '.join(sorted(present)[:5])}; nothing was added"
            )
        splits = assign_splits(new, version.items.values_list("kind", "split"), item_set.seed)
        Item.objects.bulk_create(
            [
                Item(
                    version=version,
                    key=i.key,
                    text=i.text,
                    reference=i.reference,
                    scorer=i.scorer,
                    kind=i.kind,
                    classification=i.classification,
                    split=split,
                    origin=i.origin,
                    source_task=i.source_task,
                    source_run=i.source_run,
                    verdict=i.verdict,
                    added_by=user_of(user),
                )
                for i, split in zip(new, splits, strict=True)
            ],
            batch_size=500,
        )
        payload = {
            "item_set": item_set.name,
            "created": created,
            "version": version.number,
            "items": len(new),
            "splits": dict(Counter(splits)),
            "kinds": dict(Counter(i.kind for i in new)),
            **how,
        }
        event_record(actor=actor, action=Action.ITEMSET_ITEMS_ADDED, obj=version, payload=payload)
        for item in new:  # each logged task's record says which set it was added to, and by whom
            if item.source_task is not None:
                event_record(
                    actor=actor,
                    action=Action.TASK_ADDED_TO_ITEMSET,
                    obj=item.source_task,
                    task_id=item.source_task.pk,
                    payload={
                        "item_set": item_set.name,
                        "version": version.number,
                        "key": item.key,
                        "run_id": item.source_run.pk if item.source_run else None,
                        "origin": item.origin,
                        "verdict": item.verdict,
                    },
                )
    return version, len(new)


def items_upload(
    *, name: str, rows: list[ItemRow], filename: str, content_sha256: str, actor: Actor, user: Any = None,
    description: str = "",
) -> tuple[ItemSetVersion, int]:  # fmt: skip
    """A checked file's rows (training.itemsets.rows.read_file) added to the set."""
    return items_add(
        name=name,
        new=[NewItem.of_row(row) for row in rows],
        actor=actor,
        user=user,
        description=description,
        how={"origin": Item.Origin.FILE, "filename": filename[:200], "file_sha256": content_sha256},
    )


def task_item(task: Task, *, kind: str = "", key: str = "") -> NewItem:
    """A logged task as an item: its text and reference, else the newest reviewer's verdict on its
    latest ended run (correct: that answer becomes the reference; wrong: scored by reviewers); its
    kind (the task's label unless one is given) and data class. TrainingError when it has neither."""
    if task.purged_at is not None:
        raise TrainingError(f"task {task.pk}: its content was deleted under the retention policy")
    if task.source == Task.Source.TRAINING:
        raise TrainingError(f"task {task.pk} is a training task (an item's stand-in already)")
    run = task.runs.filter(status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]).order_by("-pk").first()
    kind = (kind or task.domain or DEFAULT_KIND).strip()
    key = key or f"task-{task.pk}"
    if task.reference not in (None, ""):
        return NewItem(
            key, task.text, task.reference, task.scorer, kind, task.classification,
            origin=Item.Origin.TASK, source_task=task, source_run=run,
        )  # fmt: skip
    newest = (
        Annotation.objects.filter(run__task=task, step__isnull=True)
        .select_related("run")
        .order_by("-id")
        .first()
    )
    if newest is None:
        raise TrainingError(f"task {task.pk} has no reference and no reviewer's verdict on its answer")
    run, verdict = newest.run, newest.verdict
    reference = run.final_answer if verdict == Annotation.Verdict.CORRECT and run.final_answer else None
    return NewItem(
        key, task.text, reference, HUMAN, kind, task.classification,
        origin=Item.Origin.REVIEW, source_task=task, source_run=run, verdict=verdict,
    )  # fmt: skip


def tasks_add(
    *, name: str, tasks: list[Task], actor: Actor, user: Any = None, kind: str = "", skip_unusable: bool = False,
    how: dict[str, Any] | None = None,
) -> tuple[ItemSetVersion, int, list[str]]:  # fmt: skip
    """Logged tasks added to the set (task_item's rules). `skip_unusable`: a task with no reference
    and no verdict is passed over (a saved view's bulk add) instead of refusing them all; the reasons
    are returned."""
    new, skipped = [], []
    for task in tasks:
        try:
            new.append(task_item(task, kind=kind))
        except TrainingError as exc:
            if not skip_unusable:
                raise
            skipped.append(str(exc))
    if not new:
        raise TrainingError("none of these tasks has a reference or a reviewer's verdict")
    version, added = items_add(
        name=name, new=new, actor=actor, user=user, how={"origin": Item.Origin.TASK, **(how or {})}
    )
    return version, added, skipped


def task_items_purge(*, task: Task, now: Any, actor: Actor) -> int:
    """The items made from a task whose content was deleted: their text and reference go with it
    (in the purge's transaction); a legal hold on the task keeps both, since the purge never starts."""
    items = Item.objects.filter(source_task=task, purged_at__isnull=True)
    keys = list(items.values_list("version__item_set__name", "version__number", "key"))
    if not keys:
        return 0
    items.update(text=PURGED, reference=None, purged_at=now)
    event_record(
        actor=actor,
        action=Action.ITEMSET_ITEMS_PURGED,
        obj=task,
        task_id=task.pk,
        payload={"items": [list(k) for k in keys]},
    )
    return len(keys)


def itemset_exported(*, version: ItemSetVersion, actor: Actor, what: str) -> None:
    """Who exported which version (its hash as of the export: a version still open may grow after)."""
    with transaction.atomic():
        event_record(
            actor=actor,
            action=Action.ITEMSET_EXPORTED,
            obj=version,
            payload={
                "item_set": version.item_set.name,
                "version": version.number,
                "what": what,
                "content_hash": version.content_hash
                if version.frozen
                else manifest_of(version)["content_hash"],
                "frozen": version.frozen,
            },
        )
