"""Pending seals (audit.seals): a run's end seals its own chain and leaves a PendingSeal row; the
sealer appends the run.sealed events to the global chain in batches. Chains are made here without the
engine (audit.chain.append), as a run's end writes them."""

from __future__ import annotations

import io
import threading
import time
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from audit import chain as audit_chain
from audit.actions import Action
from audit.models import GLOBAL_CHAIN, AuditEvent, ChainPurge, LogNode, PendingSeal
from audit.seals import chains_awaiting_seal, pending_seal, seal_fields, seal_pending
from audit.services import run_chain_seal_fields
from audit.tasks import seal_pending as seal_pending_task
from audit.verify import verify
from tests.audit.support import expected_hash, sql, triggers_off

pytestmark = pytest.mark.django_db(transaction=True)

GENESIS = "0" * 64


def run_like(pk: int) -> SimpleNamespace:
    """What pending_seal reads of a run: its model's name and its pk."""
    return SimpleNamespace(_meta=SimpleNamespace(model_name="run"), pk=pk)


def run_event(action: str, correlation: uuid.UUID, run_pk: int) -> dict:
    return {
        "actor_type": "service",
        "actor_id": "",
        "actor_name": "engine",
        "action": action,
        "object_type": "run",
        "object_id": str(run_pk),
        "task_id": None,
        "correlation_id": correlation,
        "payload": {"run": run_pk},
    }


def ended_run(run_pk: int, *, pending: bool = True, made_ago: timedelta = timedelta(0)) -> AuditEvent:
    """A run chain of two events whose last (run.succeeded) seals it, and (with `pending`) its pending
    seal inserted in the same transaction, as the run's end does. Returns the chain's last event."""
    correlation = uuid.uuid4()
    name = audit_chain.run_chain(correlation)
    with transaction.atomic():
        audit_chain.append(chain=name, **run_event(Action.RUN_STARTED, correlation, run_pk))
    with transaction.atomic():
        last = audit_chain.append(
            chain=name, seal=True, **run_event(Action.RUN_SUCCEEDED, correlation, run_pk)
        )
        if pending:
            row = pending_seal(run=run_like(run_pk), task_id=None, last=last)
            row.created_at -= made_ago
            row.save()
    return last


def global_event() -> AuditEvent:
    """An event of the global chain (its head made), as a human action writes one."""
    with transaction.atomic():
        return audit_chain.append(
            chain=GLOBAL_CHAIN,
            actor_type="user",
            actor_id="1",
            actor_name="ann",
            action=Action.AUDIT_EXPORTED,
            object_type="user",
            object_id="1",
            task_id=None,
            correlation_id=None,
            payload={},
        )


def assert_global_chain_sound() -> list[AuditEvent]:
    events = list(AuditEvent.objects.filter(chain=GLOBAL_CHAIN).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "global chain: seq not contiguous"
    previous = GENESIS
    for event in events:
        assert event.prev_hash == previous, f"global seq {event.seq} does not link to the event before"
        assert event.hash == expected_hash(event), f"global seq {event.seq}: hash does not recompute"
        previous = event.hash
    return events


def seals_of(name: str) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(chain=GLOBAL_CHAIN, action=Action.RUN_SEALED, payload__chain=name).order_by(
            "seq"
        )
    )


def problems(**kwargs) -> list[tuple[str, str]]:
    report = verify(use_checkpoint=False, rows=False, **kwargs)
    return [(p.kind, p.chain) for p in report.problems]


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def wait_until_blocked(pids: list[int], timeout: float = 10.0) -> None:
    """Until every one of these backends waits on a lock (pg_blocking_pids reads the lock table live)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM unnest(%s::int[]) p WHERE cardinality(pg_blocking_pids(p)) > 0", [pids]
            )
            if cursor.fetchone()[0] == len(pids):
                return
        time.sleep(0.02)
    raise AssertionError(f"backends {pids} never waited on a lock")


class Sealer(threading.Thread):
    """seal_pending on a connection of its own, in a loop until it seals none (`once`: one batch)."""

    def __init__(self, *, limit: int = 1000, once: bool = False):
        super().__init__(daemon=True)
        self.limit, self.once = limit, once
        self.pid: int | None = None
        self.sealed: list[int] = []
        self.error: BaseException | None = None
        self.started_event = threading.Event()

    def run(self) -> None:
        try:
            self.pid = backend_pid()
            self.started_event.set()
            while True:
                count = seal_pending(limit=self.limit)
                self.sealed.append(count)
                if self.once or count == 0:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self.started_event.set()
            connections.close_all()

    def begun(self) -> int:
        self.start()
        assert self.started_event.wait(10) and self.pid is not None, self.error
        return self.pid


def lock_global_head() -> None:
    """Hold the global chain's head (the caller's transaction) as an append does."""
    sql("SELECT 1 FROM audit_chainhead WHERE chain = %s FOR UPDATE", [GLOBAL_CHAIN])


# --- the sealer ------------------------------------------------------------------------------------


def test_a_batch_of_pending_seals_is_appended_in_order_its_rows_marked_and_the_record_verifies():
    global_event()
    lasts = [ended_run(pk) for pk in range(1, 6)]
    rows = list(PendingSeal.objects.order_by("id"))
    assert [r.chain for r in rows] == [e.chain for e in lasts]
    assert problems() == []  # pending and young: fine
    assert problems(chains=[lasts[0].chain]) == []
    assert chains_awaiting_seal([e.chain for e in lasts]) == {e.chain for e in lasts}

    assert seal_pending(limit=2) == 2
    assert seal_pending() == 3
    assert seal_pending() == 0

    seals = [e for e in assert_global_chain_sound() if e.action == Action.RUN_SEALED]
    assert [s.payload["chain"] for s in seals] == [e.chain for e in lasts]  # in row order
    for row, last, seal in zip(PendingSeal.objects.order_by("id"), lasts, seals, strict=True):
        assert row.seal_event_id == seal.pk
        assert seal.payload == {"chain": last.chain, "seq": last.seq, "hash": last.hash}
        # Exactly the event the run's end appended before pending seals.
        expected = run_chain_seal_fields(run=run_like(int(row.object_id)), task_id=None, last=last)
        assert seal_fields(row) == expected
        got = {k: getattr(seal, k) for k in expected}
        assert got == {**expected, "action": str(Action.RUN_SEALED)}
    assert chains_awaiting_seal([e.chain for e in lasts]) == set()
    report = verify(use_checkpoint=False, rows=False)
    assert report.intact, report.problems
    assert verify(chains=[lasts[-1].chain], use_checkpoint=False, rows=False).intact


def test_a_sealer_killed_mid_batch_seals_nothing_and_the_next_one_seals_each_once():
    global_event()
    lasts = [ended_run(pk) for pk in range(1, 4)]
    sealer = Sealer(once=True)
    with transaction.atomic():
        lock_global_head()
        pid = sealer.begun()
        wait_until_blocked([pid])  # it holds its rows and waits for the head
        sql("SELECT pg_terminate_backend(%s)", [pid])
        sealer.join(10)
    assert not sealer.is_alive() and isinstance(sealer.error, DatabaseError), sealer.error

    assert not PendingSeal.objects.filter(seal_event_id__isnull=False).exists()
    assert not AuditEvent.objects.filter(action=Action.RUN_SEALED).exists()
    assert not PendingSeal.objects.filter(leaf_index__isnull=False).exists() and not LogNode.objects.exists()
    assert seal_pending() == 3
    assert all(len(seals_of(e.chain)) == 1 for e in lasts)
    assert sorted(PendingSeal.objects.values_list("leaf_index", flat=True)) == [0, 1, 2]  # each once
    assert_global_chain_sound()
    assert verify(use_checkpoint=False, rows=False).intact


def test_two_sealers_at_once_take_different_rows_and_never_fork_the_global_chain():
    global_event()
    lasts = [ended_run(pk) for pk in range(1, 41)]
    first, second = Sealer(limit=7), Sealer(limit=7)
    with transaction.atomic():
        lock_global_head()  # both take a batch of rows, then wait for the head
        wait_until_blocked([first.begun(), second.begun()])
        taken = sql("SELECT 1 FROM audit_pendingseal FOR UPDATE SKIP LOCKED")
        assert taken == 40 - 14  # each holds its own 7
    for sealer in (first, second):
        sealer.join(30)
        assert not sealer.is_alive() and sealer.error is None, sealer.error
    assert sum(first.sealed) + sum(second.sealed) == 40
    assert first.sealed[0] == second.sealed[0] == 7

    assert not PendingSeal.objects.filter(seal_event_id__isnull=True).exists()
    assert all(len(seals_of(e.chain)) == 1 for e in lasts)
    # One tree, never forked: each row a leaf, the indexes 0..39 each once, every signed root its leaves'.
    assert sorted(PendingSeal.objects.values_list("leaf_index", flat=True)) == list(range(40))
    assert LogNode.objects.filter(level=0).count() == 40
    events = assert_global_chain_sound()
    assert sum(e.action == Action.RUN_SEALED for e in events) == 40
    assert verify(use_checkpoint=False, rows=False).intact


def test_the_command_and_the_beat_task_print_and_return_how_many_they_sealed():
    for pk in range(1, 4):
        ended_run(pk)
    out = io.StringIO()
    call_command("audit_seal", "--batch", "2", stdout=out)
    assert out.getvalue().strip() == "3 pending seal(s) appended to the global chain"
    ended_run(4)
    assert seal_pending_task() == 1
    assert settings.CELERY_BEAT_SCHEDULE["audit-seal"] == {
        "task": "audit.tasks.seal_pending",
        "schedule": settings.AUDIT_SEAL_EVERY_S,
    }
    assert settings.CELERY_TASK_ROUTES["audit.tasks.seal_pending"]["queue"].endswith("maintenance")


# --- verification ------------------------------------------------------------------------------------


def test_a_pending_seal_older_than_the_grace_is_overdue(settings):
    settings.AUDIT_SEAL_GRACE_S = 60
    last = ended_run(1, made_ago=timedelta(seconds=90))
    young = ended_run(2)
    for found in (problems(), problems(chains=[last.chain])):
        assert found == [("overdue", last.chain)]
    report = verify(chains=[last.chain], use_checkpoint=False, rows=False)
    assert "longer than AUDIT_SEAL_GRACE_S (60 s)" in report.problems[0].detail
    assert seal_pending() == 2
    assert problems() == []
    assert young.chain in {s.payload["chain"] for s in AuditEvent.objects.filter(action=Action.RUN_SEALED)}


def test_a_pending_seal_passed_over_by_a_later_one_is_overdue():
    skipped = ended_run(1, made_ago=timedelta(seconds=10))
    ended_run(2)
    with transaction.atomic():
        PendingSeal.objects.select_for_update().get(chain=skipped.chain)  # as a sealer holding it would
        sealer = Sealer(once=True)
        sealer.start()
        sealer.join(10)
    assert sealer.error is None and sealer.sealed == [1]
    for found in (problems(), problems(chains=[skipped.chain])):
        assert found == [("overdue", skipped.chain)]
    later = PendingSeal.objects.exclude(chain=skipped.chain).get()
    report = verify(use_checkpoint=False, rows=False)
    assert f"the later pending seal row {later.pk} was sealed" in report.problems[0].detail


def test_an_ended_chain_with_neither_a_seal_nor_a_pending_seal_is_unsealed():
    last = ended_run(1, pending=False)
    ended_run(2)
    for found in (problems(), problems(chains=[last.chain])):
        assert found == [("unsealed", last.chain)]
    assert "neither a seal in the global chain nor a pending seal" in verify(rows=False).problems[0].detail


def test_the_database_refuses_to_delete_or_rewrite_a_pending_seal():
    last = ended_run(1)
    row = PendingSeal.objects.get()
    for statement in (
        "DELETE FROM audit_pendingseal",
        "TRUNCATE audit_pendingseal",
        "UPDATE audit_pendingseal SET hash = 'f'",
        "UPDATE audit_pendingseal SET seal_event_id = 1, seq = seq + 1",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            sql(statement)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        row.delete()
    seal_pending()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql("UPDATE audit_pendingseal SET seal_event_id = seal_event_id + 1")  # marked once only
    assert PendingSeal.objects.get().seal_event_id == seals_of(last.chain)[0].pk


@pytest.mark.parametrize("named", ["another chain's event", "no event"])
def test_a_pending_seal_marked_with_an_event_that_is_not_its_seal_is_named(named):
    last = ended_run(1)
    first = AuditEvent.objects.get(chain=last.chain, seq=1)
    wrong = first.pk if named == "another chain's event" else 10**12
    assert sql("UPDATE audit_pendingseal SET seal_event_id = %s", [wrong]) == 1  # the one change allowed
    why = f"that is an event of chain {last.chain}" if named == "another chain's event" else "no such event"
    for kwargs in ({}, {"chains": [last.chain]}):
        report = verify(use_checkpoint=False, rows=False, **kwargs)
        assert [(p.kind, p.chain) for p in report.problems] == [("pending", last.chain)]
        assert f"names event #{wrong} as its seal, but {why}" in report.problems[0].detail


def test_a_pending_seal_rewritten_behind_the_trigger_no_longer_matches_its_chain():
    last = ended_run(1)
    with triggers_off():
        sql("UPDATE audit_pendingseal SET hash = %s", ["e" * 64])
    for found in (problems(), problems(chains=[last.chain])):
        assert found == [("pending", last.chain)]
    assert "no longer matches its chain" in verify(rows=False).problems[0].detail


def test_a_sealed_chain_whose_pending_row_was_left_unmarked_is_named():
    last = ended_run(1)
    seal_pending()
    with triggers_off():
        sql("UPDATE audit_pendingseal SET seal_event_id = NULL")
    assert problems() == [("pending", last.chain)]
    assert "the sealer would seal the chain twice" in verify(rows=False).problems[0].detail


def test_a_purge_of_a_sealed_run_chain_deletes_its_events_and_keeps_its_pending_seal():
    last = ended_run(1)
    seal_pending()
    with transaction.atomic():
        ChainPurge.objects.create(
            chain=last.chain, last_seq=last.seq, last_hash=last.hash, purged_at=timezone.now(), reason="test"
        )
        assert AuditEvent.objects.filter(chain=last.chain).delete()[0] == 2
    assert PendingSeal.objects.filter(chain=last.chain, seal_event_id__isnull=False).exists()
    # The purge itself (unsigned, unrecorded here) is verification's to judge; the pending row adds nothing.
    assert ("pending", last.chain) not in problems()
    assert ("unsealed", last.chain) not in problems()
