"""Structured logs: every line a run's code writes carries the run's ids, and its trace id.

`bound(run)` sets them for the code inside (the engine binds a run while it executes it; threads of
its step pool copy the context); `ContextFilter` adds them to each record, as attributes that a JSON
formatter writes as fields (`LOG_FORMAT=json`, settings.LOGGING). The trace id is the run's
correlation id as OpenTelemetry writes ids (32 hex digits): the id of the run's trace
(observability.telemetry), so a log platform joins a run's lines with its spans.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pythonjsonlogger.json import JsonFormatter

_bound: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "conductor_log_ids", default=None
)


def trace_id(correlation_id: uuid.UUID | str) -> str:
    """A run's trace id: its correlation id as 32 lower-case hex digits."""
    return uuid.UUID(str(correlation_id)).hex


def ids_of(run: Any) -> dict[str, str]:
    return {
        "run_id": str(run.pk),
        "task_id": str(run.task_id),
        "correlation_id": str(run.correlation_id),
        "trace_id": trace_id(run.correlation_id),
    }


@contextmanager
def bound(run: Any) -> Iterator[None]:
    token = _bound.set(ids_of(run))
    try:
        yield
    finally:
        _bound.reset(token)


class ContextFilter(logging.Filter):
    """Adds the bound run's ids to each record (none outside a run); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_bound.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonLines(JsonFormatter):
    """One JSON object a line: time (ISO 8601 with its zone), level, logger, message, the run's ids
    when bound, any `extra=` fields, and the traceback of an exception."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("timestamp", "time")
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger"})
        super().__init__("%(levelname)s %(name)s %(message)s", *args, **kwargs)
