"""The one CSV writer of the app: every cell that a spreadsheet could read as a formula is neutralised.

Text in these files comes from people we do not trust (a task's text, a model's output, the username
typed into a failed login lands in the audit log as an actor name). A spreadsheet reads a cell that
begins with `=`, `+`, `-`, `@`, a tab or a carriage return as a formula (CSV injection). Following
OWASP, such a cell is written with a single quote in front: `'=HYPERLINK(...)`, shown as text.

Numbers are kept as numbers: an `int`, a finite `float` or a finite `Decimal` (a cost, a share, a
count, a negative number included) is written as it is; it comes from our own arithmetic, never from
a person. Anything else is text: a string that merely looks like a number (`"-2"`) is neutralised, as
are non-finite floats and Decimals (`-inf`). `None` stays an empty cell, a bool is written as it is.

The quoting is reversible, so a reader can recover the exact value (for instance to recompute an
audit event's hash): a cell that begins with quotes followed by a formula character gets one more
quote in front (`'=x` is written `''=x`), and `original_cell` removes exactly one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"


def _needs_quote(text: str) -> bool:
    return text.lstrip(QUOTE).startswith(FORMULA_STARTS)


def safe_cell(value: Any) -> Any:
    """The value as it should be handed to csv: numbers and None as they are, text neutralised."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, Decimal) and value.is_finite():
        return value
    text = value if isinstance(value, str) else str(value)
    return QUOTE + text if _needs_quote(text) else text


def original_cell(text: str) -> str:
    """The value a cell written by safe_cell held (as text): the inverse of the neutralising quote."""
    if text.startswith(QUOTE) and _needs_quote(text):
        return text[1:]
    return text


class SafeWriter:
    """csv.writer's interface; every cell goes through safe_cell."""

    def __init__(self, f: Any, dialect: str | type[csv.Dialect] = "excel", **fmtparams: Any) -> None:
        self._writer = csv.writer(f, dialect, **fmtparams)

    @property
    def dialect(self) -> Any:
        return self._writer.dialect

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow([safe_cell(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def writer(f: Any, dialect: str | type[csv.Dialect] = "excel", **fmtparams: Any) -> SafeWriter:
    return SafeWriter(f, dialect, **fmtparams)


class DictWriter(csv.DictWriter):
    """csv.DictWriter whose every cell (the header's too) goes through safe_cell."""

    def _safe(self, rowdict: Mapping[str, Any]) -> dict[str, Any]:
        return {k: safe_cell(v) for k, v in rowdict.items()}

    def writerow(self, rowdict: Mapping[str, Any]) -> Any:
        return super().writerow(self._safe(rowdict))

    def writerows(self, rowdicts: Iterable[Mapping[str, Any]]) -> None:
        for rowdict in rowdicts:
            self.writerow(rowdict)
