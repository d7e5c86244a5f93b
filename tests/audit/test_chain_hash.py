"""An event's hash has one definition (audit.proof), made in two languages: Python for the events a
process builds on a head it knows, SQL for those the database appends on the head it finds (a run's
seal in the global chain). The two agree on any content, hostile text included."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction

from audit import chain
from audit.actions import Action
from audit.models import AuditEvent
from audit.proof import canonical, canonical_around_seq, content_of, digest
from audit.verify import verify

# Text that has broken hand-made JSON and SQL before: quotes and escapes, the seq's own key, markup,
# SQL, placeholders, controls, line and paragraph separators, right-to-left marks, joined emoji. (NUL
# is not among them: PostgreSQL's text and jsonb refuse it, so no event can carry it.)
HOSTILE = [
    '"',
    "\\",
    '\\"',
    '"seq":1',
    ',"seq":',
    "</script><script>alert(1)</script>",
    "'; DROP TABLE audit_auditevent; --",
    "%s %(run_id)s %%",
    "{}[],:",
    "\x01\x08\x1f\x7f",
    "\n\r\t",
    "\u2028\u2029",
    "\u202eevil\u202c",
    "👩\u200d👩\u200d👧\u200d👦",
    "é e\u0301 ﬁ",
    "\ud7ff\ue000\U0010fffd",
    "x" * 3000,
]


def random_text(rng: random.Random) -> str:
    pieces = [rng.choice(HOSTILE) for _ in range(rng.randint(0, 3))]
    pieces.append(
        "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(160, 0xD7FF)])) for _ in range(8))
    )
    rng.shuffle(pieces)
    return "".join(pieces)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randint(0, 7 if depth < 2 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.randint(-(2**53), 2**53)
    if kind in (3, 4):
        return random_text(rng)
    if kind == 5:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = [random_text(rng)[:40] for _ in range(rng.randint(0, 4))] + ["seq"] * rng.randint(0, 1)
    return {key: random_value(rng, depth + 1) for key in keys}


def random_fields(rng: random.Random) -> dict[str, Any]:
    return {
        "actor_type": "service",
        "actor_id": random_text(rng)[:60],
        "actor_name": random_text(rng)[:150],
        "action": Action.RECORD_VIEWED,
        "object_type": random_text(rng)[:40],
        "object_id": random_text(rng)[:60],
        "task_id": uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.5 else None,
        "correlation_id": uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.5 else None,
        "payload": {"value": random_value(rng), random_text(rng)[:30]: random_value(rng)},
    }


def test_the_content_around_its_seq_is_the_canonical_content_for_any_seq():
    rng = random.Random(20261129)
    for _ in range(300):
        fields = random_fields(rng)
        occurred_at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.getrandbits(40))
        seq = rng.randint(1, 10**12)
        content = content_of(chain=random_text(rng)[:50], seq=seq, occurred_at=occurred_at, **fields)
        before, after = canonical_around_seq(content)
        assert (before + str(seq) + after).encode() == canonical(content)


@pytest.mark.django_db(transaction=True)
def test_the_database_and_python_make_the_same_hash_of_any_content():
    """Events appended alternately by Python (on the head it knows) and by the database (on the head
    it finds): each stored hash is the Python definition's of the stored content, and the chains verify."""
    rng = random.Random(42)
    chains = [f"test:hash:{i}" for i in range(6)]
    for name in chains:
        for i in range(8):
            fields = random_fields(rng)
            with transaction.atomic():
                if i % 2:
                    chain.append_on_server(chain=name, **fields)
                else:
                    chain.append(chain=name, **fields)
    events = list(AuditEvent.objects.filter(chain__in=chains).order_by("chain", "seq"))
    assert len(events) == 48
    for event in events:
        assert event.hash == digest(event.prev_hash, chain.event_content(event)), event.seq
    report = verify(chains=chains)
    assert report.intact, report.problems
