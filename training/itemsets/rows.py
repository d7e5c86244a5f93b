"""An uploaded file of items, read and checked row by row before anything is written.

Columns (a JSON object's keys, or a CSV header): `id` (required: 1 to 80 characters, letters, digits,
'-', '_' and '.'), `text` (required), `reference`, `scorer`, `kind`, `data_class`, `split`. A refused
file names each bad row by its line and says why; nothing of it is kept (the services write only a
file that passed whole).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from routing.limits import DOMAIN_MAX_CHARS, text_length_check
from routing.models import DataClass
from routing.scoring.scorers import SCORER_CHOICES, SCORERS, check_pattern, scorer_name

from ..errors import TrainingError
from ..models import ItemSplit

COLUMNS = ("id", "text", "reference", "scorer", "kind", "data_class", "split")
REQUIRED = ("id", "text")
HUMAN = "human"  # scored by reviewers' verdicts, not by a rule
ITEM_SCORERS = (*SCORER_CHOICES, HUMAN)
DEFAULT_KIND = "general"
MAX_FILE_BYTES = 4 * 1024 * 1024  # the upload's size; a bigger set is uploaded in parts
MAX_ROWS = 5000  # items in one file (training.services.MAX_ITEMS: what one rollout may take)
MAX_REFERENCE_CHARS = 10_000
MAX_ERRORS_SHOWN = 20
KEY_RULE = "1 to 80 characters: letters A-Z a-z, digits, '-', '_' and '.', starting with a letter or digit"
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}\Z", re.ASCII)
KIND_RULE = f"1 to {DOMAIN_MAX_CHARS} characters: letters, digits, '-', '_' and '.'"
_KIND = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{DOMAIN_MAX_CHARS - 1}}}\Z", re.ASCII)
# C0 controls but tab, line feed and carriage return; DEL; C1 controls. Task text is shown to people
# and sent to models: a control character there is a mistake or an attack.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class ItemRow:
    line: int
    key: str
    text: str
    reference: str | None
    scorer: str
    kind: str
    classification: str
    split: str  # "" to be assigned


class FileRefused(TrainingError):
    """The file cannot be imported; `errors` lists (line, reason), line 0 for the file as a whole."""

    def __init__(self, errors: list[tuple[int, str]]):
        self.errors = errors
        shown = "; ".join(f"line {n}: {why}" if n else why for n, why in errors[:MAX_ERRORS_SHOWN])
        more = len(errors) - MAX_ERRORS_SHOWN
        super().__init__(
            f"the file was refused, nothing was imported: {shown}"
            + (f"; and {more} more" if more > 0 else "")
        )


def template_csv() -> str:
    """The file people fill in: the header and two example rows."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerow(["q-1", "What is 17 * 24?", "408", "numeric", "arithmetic", "internal", ""])
    writer.writerow(["q-2", "Name the capital of France.", "Paris", "exact", "geography", "public", ""])
    return out.getvalue()


def read_file(content: bytes, filename: str = "") -> list[ItemRow]:
    """The checked rows of an uploaded file (JSON Lines, or CSV by its name or first character).
    Raises FileRefused with every bad row."""
    if len(content) > MAX_FILE_BYTES:
        raise FileRefused([(0, f"the file has {len(content):,} bytes; at most {MAX_FILE_BYTES:,}")])
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = content[: exc.start].count(b"\n") + 1
        raise FileRefused(
            [(line, f"not UTF-8 (byte {content[exc.start]:#04x}); save the file as UTF-8")]
        ) from exc
    if not text.strip():
        raise FileRefused([(0, "the file has no items")])
    name = filename.lower()
    is_csv = name.endswith(".csv") or (
        not name.endswith((".jsonl", ".json", ".ndjson")) and not text.lstrip().startswith("{")
    )
    raw = list(_csv_rows(text) if is_csv else _jsonl_rows(text))
    errors = [(line, row) for line, row in raw if isinstance(row, str)]
    rows: list[ItemRow] = []
    seen: dict[str, int] = {}
    for line, row in raw:
        if isinstance(row, str):
            continue
        try:
            item = _checked(line, row)
        except ValidationError as exc:
            errors.append((line, " ".join(exc.messages)))
            continue
        if item.key in seen:
            errors.append((line, f"the id {item.key!r} is on line {seen[item.key]} already"))
            continue
        seen[item.key] = line
        rows.append(item)
    if not errors and not rows:
        errors.append((0, "the file has no items"))
    if not errors and len(rows) > MAX_ROWS:
        errors.append((0, f"the file has {len(rows):,} items; at most {MAX_ROWS:,} in one file"))
    if errors:
        raise FileRefused(sorted(errors))
    return rows


def _jsonl_rows(text: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, f"not JSON ({exc.msg} at column {exc.colno})"
            continue
        yield number, row if isinstance(row, dict) else "not a JSON object"


def _csv_rows(text: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except (StopIteration, csv.Error):
        yield 1, "no header row"
        return
    header = [name.strip() for name in header]
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        yield 1, f"the header lacks the column(s) {', '.join(missing)}; columns: {', '.join(COLUMNS)}"
        return
    try:
        for cells in reader:
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) > len(header):
                yield reader.line_num, f"{len(cells)} cells for {len(header)} columns"
                continue
            yield reader.line_num, dict(zip(header, cells, strict=False))
    except csv.Error as exc:
        yield reader.line_num, f"not CSV ({exc})"


def _checked(line: int, row: dict[str, Any]) -> ItemRow:
    unknown = sorted(set(row) - set(COLUMNS))
    if unknown:
        raise ValidationError(
            f"unknown column(s) {', '.join(map(str, unknown))}; columns: {', '.join(COLUMNS)}"
        )
    for name in REQUIRED:
        if row.get(name) in (None, ""):
            raise ValidationError(f"the {name!r} column is empty")
    fields = {name: _text(name, row.get(name)) for name in COLUMNS}
    key, text = fields["id"].strip(), fields["text"]
    if not _KEY.match(key):
        raise ValidationError(f"the id {key[:40]!r} is not {KEY_RULE}")
    _plain(text, "the text")
    if not text.strip():
        raise ValidationError("the text is blank")
    text_length_check(text)
    reference = fields["reference"] if row.get("reference") not in (None, "") else None
    scorer = fields["scorer"].strip() or "auto"
    if scorer not in ITEM_SCORERS:
        raise ValidationError(f"unknown scorer {scorer!r}; one of {', '.join(ITEM_SCORERS)}")
    if reference is not None:
        _plain(reference, "the reference")
        if len(reference) > MAX_REFERENCE_CHARS:
            raise ValidationError(
                f"the reference has {len(reference):,} characters; at most {MAX_REFERENCE_CHARS:,}"
            )
    elif scorer not in (HUMAN, "auto"):
        raise ValidationError(f"the scorer {scorer!r} needs a reference")
    kind = fields["kind"].strip() or DEFAULT_KIND
    if not _KIND.match(kind):
        raise ValidationError(f"the kind {kind[:50]!r} is not {KIND_RULE}")
    if reference is not None:
        _readable(reference, scorer, kind)
    classification = fields["data_class"].strip() or DataClass.INTERNAL
    if classification not in DataClass.values:
        raise ValidationError(f"unknown data_class {classification!r}; one of {', '.join(DataClass.values)}")
    split = fields["split"].strip()
    if split and split not in ItemSplit.values:
        raise ValidationError(f"unknown split {split!r}; one of {', '.join(ItemSplit.values)}, or empty")
    return ItemRow(line, key, text, reference, scorer, kind, classification, split)


def _text(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValidationError(f"the {name!r} column is not text or a number")
    return str(value)


def _plain(text: str, what: str) -> None:
    found = _CONTROL.search(text)
    if found:
        raise ValidationError(
            f"{what} holds the control character U+{ord(found.group()):04X} at {found.start() + 1}"
        )


def _readable(reference: str, scorer: str, kind: str) -> None:
    """A reference the scorer can read: one that its scorer grades right against itself (a number for
    `numeric`, an expression for `math`), or a pattern that compiles for `regex`."""
    name = scorer_name(scorer, kind)
    if name == "regex":
        try:
            check_pattern(reference)
        except ValueError as exc:
            raise ValidationError(
                f"the reference is not a pattern the 'regex' scorer can use: {exc}"
            ) from exc
    elif name in SCORERS and SCORERS[name](reference, reference) != 1.0:
        raise ValidationError(f"the scorer {name!r} cannot read the reference {reference[:40]!r}")
