"""Recorded outcomes of real models on public benchmarks, read in place from settings.REPLAY_DIR.

One item per line: {"id", "domain", "task", "reference", "split", "outcomes": {model: {"response",
"answer", "score", "prompt_tokens", "completion_tokens", "cost_usd"}}}. Loaded once per process.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings

from .errors import ServiceError


class ReplayDataError(ServiceError):
    """The recorded data cannot serve the request (a split or an item that is not there)."""


@dataclass(frozen=True)
class ReplayItem:
    id: str
    domain: str
    task: str
    reference: str
    split: str
    outcomes: dict[str, dict[str, Any]]


def replay_dir() -> Path:
    directory = settings.REPLAY_DIR
    if directory is None:
        raise ReplayDataError("CONDUCTOR_REPLAY_DIR is not set: point it at a folder of recorded outcomes")
    if not (directory / "models.json").exists():
        raise ReplayDataError(f"{directory} has no models.json: is CONDUCTOR_REPLAY_DIR right?")
    return directory


def load_models(directory: Path | None = None) -> dict[str, dict[str, Any]]:
    return json.loads(((directory or replay_dir()) / "models.json").read_text())


def read_items(path: Path) -> list[ReplayItem]:
    opener = gzip.open if path.suffix == ".gz" else open
    items = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                items.append(
                    ReplayItem(
                        id=row["id"],
                        domain=row.get("domain", ""),
                        task=row["task"],
                        reference=str(row.get("reference", "")),
                        split=row.get("split", ""),
                        outcomes=row["outcomes"],
                    )
                )
    return items


def split_path(split: str, directory: Path | None = None) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", split or ""):
        raise ReplayDataError(f"{split!r} is not a split name (letters, digits, '-' and '_')")
    directory = directory or replay_dir()
    path = directory / f"{split}.jsonl.gz"
    if not path.exists():
        raise ReplayDataError(f"no split {split!r} in {directory}")
    return path


@lru_cache(maxsize=1)
def _index(directory: str) -> tuple[dict[str, ReplayItem], dict[str, ReplayItem]]:
    by_id: dict[str, ReplayItem] = {}
    by_text: dict[str, ReplayItem] = {}
    for path in sorted(Path(directory).glob("*.jsonl.gz")):
        for item in read_items(path):
            by_id[item.id] = item
            by_text.setdefault(item.task.strip(), item)
    return by_id, by_text


def find_item(*, item_id: str | None, texts: list[str]) -> ReplayItem | None:
    """The recorded item by id, else the first item whose task text appears in one of `texts`."""
    by_id, by_text = _index(str(replay_dir()))
    if item_id and item_id in by_id:
        return by_id[item_id]
    for text in texts:
        stripped = text.strip()
        if stripped in by_text:
            return by_text[stripped]
    for text in texts:  # the task quoted inside a longer instruction
        for task_text, item in by_text.items():
            if len(task_text) > 40 and task_text in text:
                return item
    return None


SAMPLE_SPLIT = "dev"  # held out from the learned conductor's training (the train split)


@lru_cache(maxsize=4)
def _samples(directory: str, per_domain: int, split: str) -> tuple[ReplayItem, ...]:
    items = read_items(split_path(split, Path(directory)))
    by_domain: dict[str, list[ReplayItem]] = {}
    for item in items:
        by_domain.setdefault(item.domain, []).append(item)
    # The shortest texts of each domain (they read at a glance on the submit form), ties by id; the
    # domain with the shortest text first.
    shortest = [sorted(group, key=lambda i: (len(i.task), i.id))[:per_domain] for group in by_domain.values()]
    shortest.sort(key=lambda group: (len(group[0].task), group[0].domain))
    return tuple(item for group in shortest for item in group)


def sample_items(*, per_domain: int = 2, split: str = SAMPLE_SPLIT) -> list[ReplayItem]:
    """A few recorded items per benchmark domain, offered as sample tasks (the replay pool answers
    them); none when no replay data is configured. A broken replay folder raises ReplayDataError."""
    if settings.REPLAY_DIR is None:
        return []
    return list(_samples(str(replay_dir()), per_domain, split))


def sample_label(item: ReplayItem, *, width: int = 100) -> str:
    """A one-line label for a sample: its text, or for a CRUXEval item (shared instructions, then
    code) the assertion it asks about."""
    text = " ".join(item.task.split())
    if "[PYTHON]" in item.task:
        asserts = [line.strip() for line in item.task.splitlines() if line.strip().startswith("assert ")]
        text = asserts[-1] if asserts else text
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def response_text(raw: str) -> str:
    """Recorded responses are sometimes a Python list of strings; return the text itself."""
    stripped = raw.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        try:
            value = ast.literal_eval(stripped)
        except (ValueError, SyntaxError):
            return raw
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return "\n".join(value)
    return raw
