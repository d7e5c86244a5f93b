"""Query parameters, read strictly: one place for every page and endpoint of every app.

A filter a reader asked for is either applied or refused with a reason (`InvalidParameter`, a 400):
never dropped, because an auditor shown an unfiltered list under a filter's name is misled. Pages
render the reason (conductor_web.middleware), the REST API answers `{"detail": ...}` (it is a DRF
ParseError). This module sits in the bottom package so that every app can use it.

A parameter no page or endpoint reads is refused the same way: a GET's query is an `AskedQuery`,
which notes each name the view asks for (present or not); one it holds that was never asked for is
unknown, and the middleware answers 400 naming it (`unknown_message`) instead of the view's answer.
What a view reads is what it accepts: pagination (`cursor`, `page_size`) and the API's `format` pass
where a list or endpoint reads them, and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, time
from typing import Any
from uuid import UUID

from django.http import QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from rest_framework.exceptions import ParseError

MAX_TEXT = 500  # longer than any search a person types; a longer value is a mistake or an attack
# C0 control characters other than tab, line feed and carriage return (NUL included): PostgreSQL
# text cannot hold NUL, and none of the others belongs in a filter.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class InvalidParameter(ParseError):
    """A query parameter that cannot be applied as given."""

    def __init__(self, name: str, message: str):
        self.name = name
        super().__init__(f"{name}: {message}")


class AskedQuery(QueryDict):
    """request.GET that notes the names the view asked for (get, [], getlist, `in`), present or not.
    A copy is a new query (QueryDict.copy): what is read from it is not asked of this one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.asked: set[str] = set()  # QueryDict's own __init__ asks while filling itself
        super().__init__(*args, **kwargs)
        self.asked = set()

    @classmethod
    def of(cls, query: QueryDict) -> AskedQuery:
        """The same names and values as `query` (as Django decoded them), read-only."""
        asked = cls(mutable=True, encoding=query.encoding)
        for name, values in query.lists():
            asked.setlist(name, values)
        asked._mutable = False
        asked.asked = set()
        return asked

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)

    def getlist(self, key, default=None):
        self.asked.add(key)
        return super().getlist(key, default)

    def __contains__(self, key):
        self.asked.add(key)
        return super().__contains__(key)

    def unasked(self) -> list[str]:
        """The names this query holds that the view never asked for, sorted."""
        return sorted(set(self.keys()) - self.asked)


def unknown_message(names: list[str], read: Iterable[str], path: str) -> str:
    """Why a query with parameters that `path` does not read is refused: their names, and what it reads."""
    shown = ", ".join(repr(n if len(n) <= 60 else n[:60] + "\u2026") for n in names)
    known = sorted(n for n in read if n)
    noun = "is not a query parameter" if len(names) == 1 else "are not query parameters"
    reads = f"it reads {', '.join(known)}" if known else "it reads none"
    return f"{shown} {noun} of {path}; {reads}."


def text(params: Mapping[str, str], name: str, *, max_length: int = MAX_TEXT) -> str:
    """A free-text parameter, stripped; '' when absent."""
    value = params.get(name) or ""
    if _CONTROL.search(value):
        raise InvalidParameter(name, "contains control characters")
    if len(value) > max_length:
        raise InvalidParameter(name, f"is longer than {max_length} characters")
    return value.strip()


def choice(params: Mapping[str, str], name: str, choices: Iterable[str]) -> str:
    """One of `choices`, or '' when absent."""
    value = text(params, name)
    known = [str(c) for c in choices]
    if value and value not in known:
        raise InvalidParameter(name, f"{value!r} is not one of: {', '.join(known)}")
    return value


def integer(
    params: Mapping[str, str], name: str, *, default: int | None = None, minimum: int = 0, maximum: int
) -> int | None:
    value = text(params, name)
    if not value:
        return default
    if not re.fullmatch(r"[+-]?\d{1,18}", value):
        raise InvalidParameter(name, f"{value!r} is not a whole number")
    number = int(value)
    if not minimum <= number <= maximum:
        raise InvalidParameter(name, f"must be between {minimum} and {maximum}")
    return number


def uuid(params: Mapping[str, str], name: str) -> str:
    """A UUID, as text in lower case; '' when absent."""
    value = text(params, name).lower()
    if not value:
        return ""
    try:
        return str(UUID(value))
    except ValueError:
        raise InvalidParameter(name, f"{value!r} is not a task id (a UUID)") from None


def moment(params: Mapping[str, str], name: str, *, end: bool = False) -> datetime | None:
    """A day (`2026-05-01`: its first moment, or its last with end=True) or an ISO 8601 date and time;
    without a zone it is UTC. None when absent."""
    value = text(params, name)
    if not value:
        return None
    try:
        parsed: datetime | date | None = (
            parse_date(value) if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value) else parse_datetime(value)
        )
    except ValueError:  # well formed but impossible: 2026-02-30, 25:00, +99:00
        parsed = None
    if parsed is None:
        raise InvalidParameter(
            name, f"{value!r} is not a date (YYYY-MM-DD) or a date and time (YYYY-MM-DDTHH:MM[:SS][+HH:MM])"
        )
    if not isinstance(parsed, datetime):
        parsed = datetime.combine(parsed, time.max if end else time.min)
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, UTC)
    try:
        parsed.utcoffset()
        parsed.astimezone(UTC)  # an offset that puts it out of range (year 1 or 9999)
    except (OverflowError, ValueError) as exc:
        raise InvalidParameter(name, f"{value!r} is out of range") from exc
    return parsed


def period(params: Mapping[str, str], since: str = "since", until: str = "until"):
    """(since, until) with until not before since."""
    start, stop = moment(params, since), moment(params, until, end=True)
    if start and stop and stop < start:
        raise InvalidParameter(until, "is before the start of the period")
    return start, stop
