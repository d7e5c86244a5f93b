"""Where the runs' messages are: read from the broker itself, so that the resume sweep decides on
what the broker holds, not on what the database says was sent.

Why the database alone is not enough: `Run.enqueued_at` records a send, not that its message still
exists. A message can be taken by a worker and then lost without the run hearing of it (the worker
killed while it held a retry's countdown; a task that failed before it claimed its run, acknowledged
on its way out), and a send recorded after the message was already taken (a retry's `on_retry`,
written once the database is back) makes every later comparison of times wrong. A run whose message
is nowhere is sent again, whatever lost it.

With the Redis transport (the default broker) the messages are in plain sight: the queues are lists,
and a message a worker took and has not acknowledged sits in kombu's `unacked` hash, with the time
it was taken in the `unacked_index` sorted set. Other brokers (RabbitMQ) deliver a dead consumer's
messages again themselves and keep durable queues through a restart; there the sweep trusts a
recorded send for as long as the broker's visibility timeout (`Recorded`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, cast

from django.conf import settings

# Messages read from a queue per round trip: a backlog of thousands is read in slices, so that no
# single LRANGE holds Redis for long (a run's message is about 1.5 KB).
QUEUE_SLICE = 1000


class Sent(NamedTuple):
    """What the database says of a run's delivery."""

    run_id: int
    enqueued_at: datetime | None  # its last recorded send
    heartbeat_at: datetime | None  # its last claim or heartbeat


@dataclass(frozen=True)
class RunMessages:
    """One look at the Redis broker: the queues in which each run has a message waiting, and the
    runs whose message a worker took and has not acknowledged, with the newest time one was taken."""

    waiting: dict[int, frozenset[str]] = field(default_factory=dict)
    taken: dict[int, datetime] = field(default_factory=dict)

    def pending(self, run: Sent, *, since: datetime, queue: str | None = None) -> bool:
        """A message of the run will reach a worker that claims it: it waits in `queue` (any queue
        when None), or a worker took it after `since` (the caller's bound on when a worker now dead
        could have taken it)."""
        queues = self.waiting.get(run.run_id, frozenset())
        taken = self.taken.get(run.run_id)
        return (queue in queues if queue else bool(queues)) or (taken is not None and taken > since)

    def held(self, *, before: datetime) -> dict[int, datetime]:
        """Runs whose message was taken before `before` and is still unacknowledged."""
        return {run_id: at for run_id, at in self.taken.items() if at < before}


@dataclass(frozen=True)
class Recorded:
    """A broker that cannot be read (not Redis): a send recorded since the run's last claim, within
    the broker's visibility timeout, counts as a message on its way: the broker redelivers what it
    was given."""

    visibility: timedelta

    def pending(self, run: Sent, *, since: datetime, queue: str | None = None) -> bool:
        sent = run.enqueued_at
        return (
            sent is not None
            and sent > datetime.now(UTC) - self.visibility
            and (run.heartbeat_at is None or sent >= run.heartbeat_at)
        )

    def held(self, *, before: datetime) -> dict[int, datetime]:
        return {}


def run_messages(app: Any, queues: list[str]) -> RunMessages | Recorded:
    """Read where the run_workflow messages are. The queues are read before the unacked hash: a
    message a worker takes in between moves from a list to the hash and is seen in the hash. One that
    moves the other way (a restore) in between is missed, and its run sent twice: harmless, as the
    run lock and the claim epoch make the second delivery a no-op."""
    visibility = timedelta(seconds=cast(int, settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]))
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        index_key = getattr(channel, "unacked_index_key", None)
        if index_key is None:
            return Recorded(visibility=visibility)
        client = channel.client
        waiting: dict[int, set[str]] = {}
        for queue in queues:
            for name in (channel._q_for_pri(queue, pri) for pri in channel.priority_steps):
                start = 0
                while batch := client.lrange(name, start, start + QUEUE_SLICE - 1):
                    for run_id in (r for r in map(run_of, batch) if r is not None):
                        waiting.setdefault(run_id, set()).add(queue)
                    start += QUEUE_SLICE
        taken: dict[int, datetime] = {}
        scores = dict(client.zrange(index_key, 0, -1, withscores=True))
        if scores:
            tags = list(scores)
            for tag, raw in zip(tags, client.hmget(channel.unacked_key, tags), strict=True):
                held_run = run_of(raw, unacked=True)
                if held_run is not None:
                    when = datetime.fromtimestamp(scores[tag], tz=UTC)
                    taken[held_run] = max(when, taken.get(held_run, when))
    return RunMessages(waiting={r: frozenset(q) for r, q in waiting.items()}, taken=taken)


def run_of(raw: bytes | None, *, unacked: bool = False) -> int | None:
    """The run id of a run_workflow message as the Redis transport stores it (a queue holds the
    message; the unacked hash holds [message, exchange, routing key]), or None."""
    try:
        message = json.loads(raw)  # type: ignore[arg-type]
        if unacked:
            message = message[0]
        if message["headers"]["task"] != "routing.tasks.run_workflow":
            return None
        args = json.loads(base64.b64decode(message["body"]))[0]
        return int(args[0])
    except (TypeError, ValueError, KeyError, IndexError):
        return None
