"""Live updates: small events sent to browsers after commit, over Channels.

Each event carries the run's audit-chain sequence number: strictly increasing per run and gap-free,
so a page that sees a gap (or reconnects) knows it missed something and re-reads the task over REST.
PostgreSQL stays the source of truth; a lost live event costs a re-read, never a wrong page.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


def task_group(task_id: Any) -> str:
    return f"task.{task_id}"


def publish_on_commit(*, task_id: Any, event: dict[str, Any]) -> None:
    """Send `event` to the task's watchers once the current transaction commits (never before)."""
    transaction.on_commit(lambda: _send(task_group(task_id), event))


def _send(group: str, event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    # sent_at: wall-clock time right after the commit, so a watcher can measure commit-to-screen latency.
    try:
        async_to_sync(layer.group_send)(
            group, {"type": "run.event", "event": {**event, "sent_at": time.time()}}
        )
    except Exception:  # noqa: BLE001 - a live update must never fail the run; pages re-read on gaps
        log.warning("could not publish a live event to %s", group, exc_info=True)
