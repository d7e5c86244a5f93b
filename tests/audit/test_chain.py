"""The hash chains of the audit record: layout, hashes, seals, append-only tables, tamper detection,
signed checkpoints. Runs go through the real engine against the loopback OpenAI server."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from datetime import UTC

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit import chain as audit_chain
from audit.checkpoints import checkpoint_create
from audit.models import GLOBAL_CHAIN, AuditEvent, ChainHead, Checkpoint
from audit.services import Actor, event_record, legal_hold_place
from audit.verify import verify
from tests.audit.support import audit_verify, expected_hash, run_now, sql, submit, triggers_off
from tests.openai_server import Reply, plan_json, program_one_step_run

GENESIS = "0" * 64
transactional = pytest.mark.django_db(transaction=True)


def chain_events(name: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=name).order_by("seq"))


def assert_chain_sound(name: str) -> list[AuditEvent]:
    events = chain_events(name)
    assert events, f"chain {name} is empty"
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), f"{name}: seq not contiguous"
    previous = GENESIS
    for event in events:
        assert event.prev_hash == previous, f"{name} seq {event.seq} does not link to the event before"
        assert event.hash == expected_hash(event), f"{name} seq {event.seq}: hash does not recompute"
        previous = event.hash
    return events


def seal_of(run) -> AuditEvent:
    return AuditEvent.objects.get(chain=GLOBAL_CHAIN, action="run.sealed", object_id=str(run.pk))


# --- layout, hashes and seals -------------------------------------------------------------------


@transactional
def test_run_events_go_to_the_run_chain_human_actions_to_global_and_every_hash_recomputes(
    finished_run, make_user
):
    run = finished_run
    ann = make_user("ann", "admin")
    assert (
        Client().post("/login/", {"username": "ann", "password": "correct horse battery staple"}).status_code
        == 302
    )
    with transaction.atomic():
        event_record(actor=Actor.for_user(ann), action="audit.exported", obj=ann, payload={"text": "checked"})
    legal_hold_place(task=run.task, actor=Actor.for_user(ann), reason="inquiry 7")

    run_chain = f"run:{run.correlation_id}"
    run_events = assert_chain_sound(run_chain)
    actions = [e.action for e in run_events]
    assert actions[0] == "task.submitted" and actions[1] == "run.started"
    assert actions[-1] == "run.succeeded"
    assert actions.count("step.succeeded") == 2 and "plan.emitted" in actions
    # Every event of the run, and only those, is in the run's chain.
    assert set(AuditEvent.objects.filter(correlation_id=run.correlation_id).values_list("id", flat=True)) == {
        e.pk for e in run_events
    }
    assert all(e.correlation_id == run.correlation_id for e in run_events)

    global_events = assert_chain_sound(GLOBAL_CHAIN)
    human = [e for e in global_events if e.actor_type == AuditEvent.ActorType.USER]
    assert [e.action for e in human] == ["auth.login", "audit.exported", "legalhold.placed"]
    assert all(e.actor_name == "ann" and e.actor_id == str(ann.pk) for e in human)
    assert not AuditEvent.objects.filter(actor_type="user").exclude(chain=GLOBAL_CHAIN).exists()
    # Only these two chains exist, and each is sound.
    assert set(AuditEvent.objects.values_list("chain", flat=True)) == {GLOBAL_CHAIN, run_chain}
    assert verify().intact


@transactional
@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_a_finished_run_chain_is_sealed_into_the_global_chain_and_refuses_more_events(live_pool, outcome):
    program_one_step_run(live_pool["server"], outcome)
    run = run_now(submit())
    assert run.status == outcome

    name = f"run:{run.correlation_id}"
    last = chain_events(name)[-1]
    assert last.action == f"run.{outcome}"
    head = ChainHead.objects.get(chain=name)
    assert head.sealed and (head.seq, head.hash) == (last.seq, last.hash)
    seal = seal_of(run)
    assert seal.payload == {"chain": name, "seq": last.seq, "hash": last.hash}
    assert seal.pk > last.pk and seal.actor_name == "engine"

    count = AuditEvent.objects.count()
    with pytest.raises(RuntimeError, match="sealed"), transaction.atomic():
        event_record(
            actor=Actor.service("late"),
            action="step.started",
            obj=run,
            task_id=run.task_id,
            correlation_id=run.correlation_id,
        )
    with pytest.raises(RuntimeError, match="sealed"), transaction.atomic():
        audit_chain.append(
            chain=name,
            actor_type="service",
            actor_id="",
            actor_name="late",
            action="step.started",
            object_type="run",
            object_id=str(run.pk),
            task_id=None,
            correlation_id=None,
            payload={},
        )
    assert AuditEvent.objects.count() == count
    assert ChainHead.objects.get(chain=name).seq == last.seq


@transactional
def test_an_event_outside_the_transaction_of_its_change_is_refused(make_user):
    user = make_user("ann")
    count = AuditEvent.objects.count()
    with pytest.raises(RuntimeError, match="inside the transaction"):
        event_record(actor=Actor.for_user(user), action="audit.exported", obj=user)
    assert AuditEvent.objects.count() == count


# --- append-only --------------------------------------------------------------------------------


@pytest.fixture
def some_record(db, audit_files, make_user):
    ann = make_user("ann", "auditor")
    for i in range(3):
        with transaction.atomic():
            event_record(actor=Actor.for_user(ann), action="audit.exported", obj=ann, payload={"i": i})
    checkpoint = checkpoint_create()
    return AuditEvent.objects.filter(chain=GLOBAL_CHAIN, action="audit.exported").first(), checkpoint


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_auditevent SET payload = '{\"i\": 99}'::jsonb WHERE id = %(event)s",
        "UPDATE audit_auditevent SET seq = seq + 100",
        "DELETE FROM audit_auditevent WHERE id = %(event)s",
        "DELETE FROM audit_auditevent",
        "TRUNCATE audit_auditevent",
        "UPDATE audit_checkpoint SET signature = 'forged' WHERE id = %(checkpoint)s",
        "DELETE FROM audit_checkpoint WHERE id = %(checkpoint)s",
        "TRUNCATE audit_checkpoint, audit_checkpointhead",
        "DELETE FROM audit_checkpointhead",
        "TRUNCATE audit_auditevent, audit_checkpoint, audit_checkpointhead",
    ],
)
def test_the_database_rejects_update_delete_and_truncate_of_the_record(some_record, statement):
    event, checkpoint = some_record
    events_before = list(AuditEvent.objects.order_by("id").values_list("id", "seq", "payload", "hash"))
    checkpoints_before = list(Checkpoint.objects.values_list("id", "signature"))

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql(statement, {"event": event.pk, "checkpoint": checkpoint.pk})

    assert (
        list(AuditEvent.objects.order_by("id").values_list("id", "seq", "payload", "hash")) == events_before
    )
    assert list(Checkpoint.objects.values_list("id", "signature")) == checkpoints_before


def test_the_orm_cannot_change_the_record_either(some_record):
    event, checkpoint = some_record
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="nothing.happened")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        event.delete()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Checkpoint.objects.all().delete()
    assert AuditEvent.objects.get(pk=event.pk).action == "audit.exported"


@transactional
@pytest.mark.parametrize("target", ["global", "sealed run"])
def test_a_purge_row_forged_without_superuser_rights_does_not_hide_deleted_events(
    finished_run, audit_files, target
):
    """The trigger lets events of a chain with a ChainPurge row be deleted (retention needs that), and
    the app's own database user may insert such a row: verification must not take it on trust."""
    checkpoint_create()
    name = GLOBAL_CHAIN if target == "global" else f"run:{finished_run.correlation_id}"
    seal = seal_of(finished_run).payload
    last_seq, last_hash = (seal["seq"], seal["hash"]) if target == "sealed run" else (0, GENESIS)
    # No triggers switched off: plain INSERT and DELETE, as any holder of the app's credentials could.
    sql(
        "INSERT INTO audit_chainpurge (chain, last_seq, last_hash, purged_at, reason) VALUES (%s, %s, %s, now(), 'x')",
        [name, last_seq, last_hash],
    )
    if target == "global":  # the trigger never lets the global chain be purged, purge row or not
        with pytest.raises(DatabaseError, match="append-only"):
            sql("DELETE FROM audit_auditevent WHERE chain = %s", [name])
        return
    assert sql("DELETE FROM audit_auditevent WHERE chain = %s", [name]) > 0

    report = verify()
    assert not report.intact
    assert any(
        p.kind == "purge" and p.chain == name and "no signature" in p.detail for p in report.problems
    ), report.problems
    code, out, _ = audit_verify()
    assert code == 1 and "NOT INTACT" in out


# --- tamper detection ---------------------------------------------------------------------------


@transactional
def test_an_intact_record_verifies_up_to_the_last_event(finished_run):
    code, out, err = audit_verify()

    last = AuditEvent.objects.order_by("-id").first()
    assert code == 0, out + err
    assert f"intact up to event {last.pk} " in out
    assert f"({AuditEvent.objects.count()} events in 2 chains)" in out
    report = verify()
    assert report.intact and report.last_event_id == last.pk


@transactional
def test_an_altered_payload_is_named_by_the_command_and_by_verify(finished_run):
    run = finished_run
    target = AuditEvent.objects.get(
        correlation_id=run.correlation_id, action="step.succeeded", payload__index=0
    )
    with triggers_off():
        changed = sql(
            "UPDATE audit_auditevent SET payload = jsonb_set(payload, '{cost_usd}', '\"999\"') WHERE id = %s",
            [target.pk],
        )
    assert changed == 1

    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("audit_verify", stdout=out, stderr=err)
    assert exited.value.code == 1
    out, err = out.getvalue(), err.getvalue()
    assert f"NOT INTACT: altered: event #{target.pk} " in out
    assert f"altered: event #{target.pk} (run:{run.correlation_id}, seq {target.seq})" in err

    report = verify(rows=False)
    assert [(p.kind, p.event_id) for p in report.problems] == [("altered", target.pk)]
    # The rows no longer match the forged event either: its attempt's cost is named too.
    assert [p.kind for p in verify().problems] == ["altered", "row"]


@transactional
def test_a_deleted_event_in_the_middle_of_a_chain_is_named_by_its_seq_not_the_next_event(finished_run):
    name = f"run:{finished_run.correlation_id}"
    events = chain_events(name)
    before, gone, after = events[2], events[3], events[4]
    with triggers_off():
        assert sql("DELETE FROM audit_auditevent WHERE id = %s", [gone.pk]) == 1

    report = verify(rows=False)
    assert [(p.kind, p.event_id, p.chain, p.seq) for p in report.problems] == [
        ("missing", None, name, gone.seq)
    ]
    problem = report.problems[0]
    assert (
        f"seq {gone.seq} is gone: the chain jumps from event #{before.pk} (seq {before.seq}) to event #{after.pk}"
        in (problem.detail)
    )
    assert problem.expected == f"seq {gone.seq} linking to hash {before.hash[:16]}…"
    code, out, _ = audit_verify()
    assert code == 1 and f"missing: chain {name} ({name}, seq {gone.seq})" in out


@transactional
def test_a_deleted_tail_of_a_sealed_run_chain_is_found_through_its_seal(finished_run):
    name = f"run:{finished_run.correlation_id}"
    events = chain_events(name)
    seal = seal_of(finished_run)
    with triggers_off():
        assert sql("DELETE FROM audit_auditevent WHERE chain = %s AND seq >= %s", [name, events[-2].seq]) == 2

    # What is left of the chain links up perfectly; only the seal in the global chain gives it away.
    assert_chain_sound(name)
    report = verify(rows=False)
    assert len(report.problems) == 1
    problem = report.problems[0]
    assert (problem.kind, problem.chain, problem.event_id, problem.seq) == (
        "missing",
        name,
        None,
        events[-2].seq,
    )
    assert problem.near_id == events[-3].pk
    assert (
        f"seq {events[-2].seq}..{events[-1].seq} are gone after event #{events[-3].pk} (seq {events[-3].seq}); "
        f"its seal #{seal.pk} says the chain ends at seq {events[-1].seq}"
    ) in problem.detail
    code, out, _ = audit_verify()
    assert code == 1 and "NOT INTACT: missing" in out


@transactional
def test_a_run_chain_deleted_entirely_is_found_through_its_seal(finished_run):
    name = f"run:{finished_run.correlation_id}"
    with triggers_off():
        sql("DELETE FROM audit_auditevent WHERE chain = %s", [name])

    report = verify(rows=False)
    assert [(p.kind, p.chain) for p in report.problems] == [("missing", name)]
    assert "all events of this sealed chain are gone" in report.problems[0].detail


@transactional
def test_swapping_the_seq_of_two_events_is_reported_as_reordered(finished_run):
    name = f"run:{finished_run.correlation_id}"
    events = chain_events(name)
    a, b = events[2], events[3]
    with triggers_off():
        sql("UPDATE audit_auditevent SET seq = 1000000 WHERE id = %s", [a.pk])
        sql("UPDATE audit_auditevent SET seq = %s WHERE id = %s", [a.seq, b.pk])
        sql("UPDATE audit_auditevent SET seq = %s WHERE id = %s", [b.seq, a.pk])

    report = verify(rows=False)
    assert [(p.kind, p.event_id) for p in report.problems] == [("reordered", b.pk)]
    code, out, _ = audit_verify()
    assert code == 1 and f"reordered: event #{b.pk} " in out


# --- checkpoints --------------------------------------------------------------------------------


def canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _c2sp_open(note: str, key: Ed25519PublicKey) -> list[str]:
    """A C2SP signed note checked as the spec reads (written here, apart from audit.note): the text's
    lines, once the signature line of the key named by the text's first line holds."""
    text, _, signatures = note.rpartition("\n\n")
    text += "\n"
    origin = text.split("\n")[0]
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key_hash = hashlib.sha256(origin.encode() + b"\n\x01" + raw).digest()[:4]
    for line in signatures.splitlines():
        name, blob = line.removeprefix("\u2014 ").split(" ")
        decoded = base64.b64decode(blob)
        if name == origin and decoded[:4] == key_hash:
            key.verify(decoded[4:], text.encode())  # raises if it does not hold
            return text[:-1].split("\n")
    raise AssertionError(f"no signature of {origin} in {note!r}")


@transactional
def test_a_checkpoint_is_a_signed_tree_head_whose_file_verifies_with_the_public_key(
    finished_run, audit_files, settings
):
    sealed_chain = f"run:{finished_run.correlation_id}"
    submit("Still queued")  # its chain is not in the log: a checkpoint does not grow with open runs
    global_last = AuditEvent.objects.filter(chain=GLOBAL_CHAIN).order_by("-seq").first()

    checkpoint = checkpoint_create()

    path = audit_files.AUDIT_CHECKPOINT_DIR / checkpoint.file_name
    assert path.is_file() and path.suffix == ".note" and path.read_text() == checkpoint.note
    assert sorted(p.name for p in audit_files.AUDIT_CHECKPOINT_DIR.rglob("*.note")) == [
        f"checkpoint-{n:010d}.note" for n in range(1, checkpoint.number + 1)
    ]  # the sealer signed the first after the run's seal
    public_key = serialization.load_pem_public_key(
        audit_files.AUDIT_SIGNING_KEY_FILE.with_name("signing-key.pub.pem").read_bytes()
    )
    assert isinstance(public_key, Ed25519PublicKey)
    lines = _c2sp_open(path.read_text(), public_key)
    tail = AuditEvent.objects.filter(chain=sealed_chain).order_by("-seq").first()
    leaf = json.dumps(
        {
            "chain": sealed_chain,
            "hash": tail.hash,
            "object_id": str(finished_run.pk),
            "object_type": "run",
            "seq": tail.seq,
            "task_id": str(finished_run.task_id),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    one_leaf_root = hashlib.sha256(b"\x00" + leaf).digest()  # RFC 9162: a tree of one leaf
    assert lines == [
        settings.AUDIT_LOG_ORIGIN,
        "1",
        base64.b64encode(one_leaf_root).decode(),
        f"{GLOBAL_CHAIN} {global_last.seq} {global_last.hash}",
        f"number {checkpoint.number}",
        f"previous {checkpoint.body['previous']}",
        f"time {checkpoint.created_at.isoformat()}",
    ]
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert checkpoint.key_id == hashlib.sha256(raw).hexdigest()[:16]
    forged = path.read_text().replace(
        f"{GLOBAL_CHAIN} {global_last.seq} ", f"{GLOBAL_CHAIN} {global_last.seq - 1} "
    )
    with pytest.raises(InvalidSignature):
        _c2sp_open(forged, public_key)

    recorded = AuditEvent.objects.filter(chain=GLOBAL_CHAIN).order_by("-seq").first()
    assert recorded.action == "audit.checkpoint" and recorded.object_id == str(checkpoint.pk)
    assert recorded.seq == global_last.seq + 1
    report = verify()
    assert report.intact and report.checkpoint_id == checkpoint.pk
    assert f"checkpoint {checkpoint.number} (" in report.summary() and report.summary().endswith("verifies")


@transactional
def test_a_checkpoint_whose_global_head_no_longer_matches_is_reported(finished_run, audit_files):
    checkpoint = checkpoint_create()
    signed_seq = checkpoint.body["heads"][GLOBAL_CHAIN][0]
    with triggers_off():
        # Cut the chain back past the signed head; nothing after it links to the removed events.
        assert (
            sql("DELETE FROM audit_auditevent WHERE chain = %s AND seq >= %s", [GLOBAL_CHAIN, signed_seq])
            >= 1
        )

    assert verify(use_checkpoint=False, rows=False).intact, "a cut tail is invisible without the checkpoint"
    report = verify(rows=False)
    missing = [p for p in report.problems if "is missing" in p.detail]
    assert missing and all(p.kind == "checkpoint" for p in report.problems), report.problems
    assert f"checkpoint {checkpoint.number} (" in missing[-1].detail
    assert f": event {signed_seq} of chain {GLOBAL_CHAIN} is missing" in missing[-1].detail
    code, out, _ = audit_verify()
    assert code == 1 and "NOT INTACT: checkpoint" in out


@transactional
def test_a_global_chain_rewritten_consistently_after_a_checkpoint_is_caught_by_the_checkpoint(
    finished_run, audit_files
):
    checkpoint = checkpoint_create()
    seq, signed_hash = checkpoint.body["heads"][GLOBAL_CHAIN]
    events = list(AuditEvent.objects.filter(chain=GLOBAL_CHAIN, seq__gte=seq).order_by("seq"))
    assert events[0].hash == signed_hash
    previous = events[0].prev_hash
    with triggers_off():
        # Forge the signed head and recompute every hash after it, as an insider with the code could.
        for event in events:
            if event.seq == seq:
                event.payload = {**event.payload, "forged": True}
            event.prev_hash = previous
            event.hash = expected_hash(event)
            AuditEvent.objects.filter(pk=event.pk).update(
                payload=event.payload, prev_hash=event.prev_hash, hash=event.hash
            )
            previous = event.hash

    assert verify(use_checkpoint=False, rows=False).intact, (
        "a consistent rewrite is invisible without the checkpoint"
    )
    report = verify(rows=False)
    assert [p.kind for p in report.problems] == ["checkpoint"]
    assert (
        f"event #{events[0].pk} (global seq {seq}) differs from the signed head" in report.problems[0].detail
    )


@transactional
def test_a_checkpoint_verified_with_a_different_key_is_reported(finished_run, audit_files, tmp_path):
    from audit import signing

    checkpoint = checkpoint_create()
    assert verify().intact
    first_key = audit_files.AUDIT_SIGNING_KEY_FILE

    audit_files.AUDIT_SIGNING_KEY_FILE = tmp_path / "other" / "signing-key.pem"
    signing._load.cache_clear()
    report = verify()
    # Every checkpoint file is named (the sealer's and this one), and nothing is taken as signed.
    assert [p.kind for p in report.problems] == ["checkpoint"] * checkpoint.number, report.problems
    assert (
        f"checkpoint {checkpoint.number} ({checkpoint.file_name}): the signature does not hold with the trusted key "
        f"{signing.key_id()}" in (report.problems[checkpoint.number - 1].detail)
    )
    assert signing.key_id() != checkpoint.key_id
    code, out, _ = audit_verify()
    assert code == 1

    audit_files.AUDIT_SIGNING_KEY_FILE = first_key
    signing._load.cache_clear()
    assert verify().intact


def test_a_checkpoint_taken_while_the_global_chain_is_still_empty_verifies(db, audit_files, make_user):
    # A new installation: the periodic checkpoint may run before any global event exists.
    assert not AuditEvent.objects.exists()
    checkpoint = checkpoint_create()
    assert checkpoint.body["heads"] == {GLOBAL_CHAIN: [0, GENESIS]}
    ann = make_user("ann", "auditor")
    with transaction.atomic():
        event_record(actor=Actor.for_user(ann), action="audit.exported", obj=ann)

    report = verify()
    assert report.intact, report.summary()
    assert report.checkpoint_id == checkpoint.pk


@pytest.mark.django_db
def test_an_action_not_declared_in_the_one_list_is_refused_and_nothing_is_written(make_user):
    user = make_user("ann")
    before = AuditEvent.objects.count()
    with pytest.raises(ValueError, match="declare it in audit.actions.Action"), transaction.atomic():
        event_record(actor=Actor.for_user(user), action="note.added", obj=user)
    assert AuditEvent.objects.count() == before


def test_the_summary_counts_in_words_and_writes_the_checkpoints_time_as_the_pages_do():
    """The dossier read "(11 events in 1 chains)" and a checkpoint at "2026-11-26T20:45:30.352748+00:00"."""
    from audit.verify.report import Report

    report = Report(events=11, chains=1, last_event_id=40, checkpoint_number=3)
    report.checkpoint_at = "2026-11-26T21:45:30.352748+01:00"
    assert report.summary() == (
        "intact up to event 40 (11 events in 1 chain); checkpoint 3 (2026-11-26 20:45:30 UTC) verifies"
    )
    assert "(1 event in 2 chains)" in Report(events=1, chains=2, last_event_id=1).summary()


def test_the_verify_page_writes_the_latest_checkpoints_time_as_the_pages_do(db, audit_files, make_user):
    """The verify page read "Latest checkpoint 7 at 2026-11-27T00:59:01.516226+00:00"."""
    checkpoint = checkpoint_create()
    client = Client()
    client.force_login(make_user("ann", "auditor"))

    page = client.get("/audit/verify/").content.decode()

    written = checkpoint.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"Latest checkpoint {checkpoint.number} at {written}, key {checkpoint.key_id}." in page
    assert checkpoint.created_at.isoformat() not in page


@transactional
def test_a_checkpoint_is_the_same_size_however_many_runs_moved(finished_run, audit_files):
    first = checkpoint_create()
    for n in range(5):
        queued = submit(f"Moves after the first checkpoint {n}")
        with transaction.atomic():
            event_record(
                actor=Actor.service("test"),
                action="task.submitted",
                obj=queued,
                task_id=queued.task_id,
                correlation_id=queued.correlation_id,
            )
    second = checkpoint_create()

    assert set(second.body["heads"]) == set(first.body["heads"]) == {GLOBAL_CHAIN}
    assert len(second.note.splitlines()) == len(first.note.splitlines())
    assert second.body["tree"] == first.body["tree"]  # open runs are not in the log until they end
    report = verify()
    assert report.intact, report.problems


@transactional
def test_appends_move_a_chain_head_in_place_without_touching_its_indexes(make_user):
    """A head's update changes no indexed column: PostgreSQL updates it on its page (HOT), and none of
    the table's indexes gets a new entry for it."""
    user = make_user("hot")
    with transaction.atomic():
        for _ in range(6):
            event_record(actor=Actor.for_user(user), action="task.submitted", obj=user)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_stat_get_xact_tuples_updated('audit_chainhead'::regclass), "
                "pg_stat_get_xact_tuples_hot_updated('audit_chainhead'::regclass)"
            )
            updated, hot = cursor.fetchone()
    assert updated >= 5 and hot == updated


# --- appends whose hash the server makes ---------------------------------------------------------


@transactional
def test_a_run_ended_in_one_statement_leaves_its_seal_for_the_sealer_with_its_totals(live_pool, make_user):
    """The run's end is one statement when the run is as the engine last read it: its answer, the task's
    totals, the sealing event and its pending seal land together; the sealer appends the seal to the
    global chain; the record verifies, and the task's totals are its runs'."""
    server = live_pool["server"]
    runs = []
    for answer in ("first", "second"):
        server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
        server.program("alpha", [Reply(answer)])
        with CaptureQueriesContext(connection) as captured:
            runs.append(run_now(submit()))
    ended = [q["sql"] for q in captured.captured_queries if 'INSERT INTO "audit_pendingseal"' in q["sql"]]
    assert len(ended) == 1 and ended[0].startswith("WITH run_as_assumed AS"), (
        "the second run did not end in one statement"
    )

    for run in runs:
        assert run.status == "succeeded"
        name = f"run:{run.correlation_id}"
        last = chain_events(name)[-1]
        assert last.action == "run.succeeded" and ChainHead.objects.get(chain=name).sealed
        assert seal_of(run).payload == {"chain": name, "seq": last.seq, "hash": last.hash}
        assert last.payload["cost_usd"] == str(run.cost_usd)
        task = run.task
        task.refresh_from_db()
        assert (task.status, task.final_answer) == ("succeeded", run.final_answer)
        assert (task.cost_usd, task.input_tokens) == (run.cost_usd, run.input_tokens)
    assert [r.final_answer for r in runs] == ["first", "second"]
    assert_chain_sound(GLOBAL_CHAIN)
    assert verify().intact
