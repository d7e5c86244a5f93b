"""Tampering as a PostgreSQL superuser would, case by case, against runs made by the real engine.

Each case rewrites the record so that the database alone still looks whole (hashes recomputed, rows
deleted with the triggers off, purges inserted by hand); verification must catch it from what the
database does not hold: the signed checkpoint files and the key.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import Client
from django.utils import timezone

from accounts.models import Role
from audit import chain as audit_chain
from audit import log, merkle, signing
from audit.checkpoints import checkpoint_create, purge_body
from audit.models import GLOBAL_CHAIN, AuditEvent, ChainPurge, Checkpoint, PendingSeal
from audit.verify import verify
from routing.models import Attempt, Run, RunStatus, Step
from tests.audit.support import audit_verify, expected_hash, rehash, run_now, sql, submit, triggers_off
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


def chain_of(run: Run) -> str:
    return f"run:{run.correlation_id}"


def seal_of(run: Run) -> AuditEvent:
    return AuditEvent.objects.get(chain=GLOBAL_CHAIN, action="run.sealed", object_id=str(run.pk))


def rewrite_run_and_its_seal(run: Run) -> AuditEvent:
    """Forge a step's response hash in the run's chain, recompute the chain, then make its seal and
    the global chain after it agree. Returns the forged event."""
    name = chain_of(run)
    target = AuditEvent.objects.get(chain=name, action="step.succeeded", payload__index=0)

    def forge(event: AuditEvent) -> None:
        if event.pk == target.pk:
            event.payload = {**event.payload, "response_sha256": "0" * 64}

    rehash(name, target.seq, forge)
    tail = AuditEvent.objects.filter(chain=name).order_by("-seq").first()
    seal = seal_of(run)

    with triggers_off():  # and its pending seal (audit.seals), which holds the same hash
        sql("UPDATE audit_pendingseal SET hash = %s WHERE chain = %s", [tail.hash, name])
    rebuild_the_log()

    def reseal(event: AuditEvent) -> None:
        if event.pk == seal.pk:
            event.payload = {**event.payload, "hash": tail.hash}
        if event.action == "audit.log_grown":  # the roots the sealer recorded, of the rebuilt tree
            event.payload = {**event.payload, "root": log.root(event.payload["size"]).hex()}

    rehash(GLOBAL_CHAIN, seal.seq, reseal)
    return target


def rebuild_the_log() -> None:
    """The log's tree recomputed from the pending seals as they now are, every node, as a forger with
    the code would: only the roots the checkpoints signed still say what it was."""
    frontier: dict = {}
    with triggers_off():
        sql("DELETE FROM audit_lognode")
        for row in PendingSeal.objects.filter(leaf_index__isnull=False).order_by("leaf_index"):
            for (level, index), node in merkle.completed(
                row.leaf_index, merkle.leaf_hash(log.leaf_of(row)), frontier
            ):
                sql(
                    "INSERT INTO audit_lognode (level, index, hash) VALUES (%s, %s, %s)", [level, index, node]
                )


def public_key_file(tmp_path) -> str:
    path = tmp_path / "audit-public.pem"
    path.write_text(signing.public_pem())
    return str(path)


# --- 1. the trust anchor is outside the database -------------------------------------------------


def test_rehashed_chains_with_their_checkpoint_rows_deleted_are_caught_by_the_signed_files(
    finished_run, audit_files, tmp_path
):
    checkpoint = checkpoint_create()
    checkpoint_event = AuditEvent.objects.get(action="audit.checkpoint", object_id=str(checkpoint.pk))
    rewrite_run_and_its_seal(finished_run)
    with triggers_off():
        sql("DELETE FROM audit_checkpointhead")
        assert sql("DELETE FROM audit_checkpoint") == checkpoint.number  # the sealer's and this one

    # What the database holds links up perfectly: the old verifier said "intact".
    assert verify(use_checkpoint=False, rows=False).intact
    report = verify(rows=False)
    assert not report.intact
    details = {p.detail for p in report.problems}
    assert (
        f"checkpoint {checkpoint.number} ({checkpoint.file_name}): its row is gone from the database"
        in details
    )
    # The log was rebuilt around the rewritten end: the roots the files signed are not its roots.
    assert any(p.kind == "log" and "the tree was rewritten" in p.detail for p in report.problems), (
        report.problems
    )
    assert any(
        p.chain == GLOBAL_CHAIN and "differs from the signed head" in p.detail for p in report.problems
    ), report.problems
    # The checkpoint's own event is still in the global chain: it names the row that is gone.
    assert any(
        p.event_id == checkpoint_event.pk and f"names checkpoint row {checkpoint.pk}" in p.detail
        for p in report.problems
    )
    code, out, err = audit_verify(
        "--checkpoints", str(audit_files.AUDIT_CHECKPOINT_DIR), "--public-key", public_key_file(tmp_path)
    )
    assert code == 1 and "NOT INTACT" in out and "its row is gone from the database" in err


def test_every_checkpoint_is_checked_not_only_the_latest(finished_run, audit_files):
    checkpoint_create()
    checkpoint_create()
    rewrite_run_and_its_seal(finished_run)  # the whole tree rebuilt: only the signed roots hold

    report = verify(rows=False)
    assert report.checkpoints_checked == 3
    for number in range(1, 4):
        assert any(
            p.kind == "log"
            and p.detail.startswith(f"checkpoint {number} (")
            and "the tree was rewritten" in p.detail
            for p in report.problems
        ), (number, report.problems)


def test_a_checkpoint_file_signed_with_another_key_is_refused_whatever_key_it_carries(
    finished_run, audit_files
):
    checkpoint_create()
    rewrite_run_and_its_seal(finished_run)
    # The forger signs a fresh checkpoint of the rewritten heads with a key of their own and ships the
    # public key inside the file, as a genuine file does.
    forger = Ed25519PrivateKey.generate()
    head = AuditEvent.objects.filter(chain=GLOBAL_CHAIN).order_by("-seq").first()
    body = {
        "format": "conductor-web/audit-checkpoint/2",
        "number": 2,
        "previous": "0" * 64,
        "created_at": timezone.now().isoformat(),
        "key_id": signing.key_id(forger.public_key()),
        "heads": {GLOBAL_CHAIN: [head.seq, head.hash]},
    }
    document = {
        "body": body,
        "signature": forger.sign(audit_chain.canonical(body)).hex(),
        "public_key": signing.public_pem(forger.public_key()),
    }
    (audit_files.AUDIT_CHECKPOINT_DIR / "checkpoint-0000000002.json").write_text(json.dumps(document))

    report = verify(rows=False)
    assert any(
        "checkpoint 2 (checkpoint-0000000002.json): the signature does not hold with the trusted key"
        in p.detail
        for p in report.problems
    ), report.problems


def test_a_checkpoint_event_whose_row_and_file_are_gone_is_flagged(finished_run, audit_files):
    checkpoint_create()
    second = checkpoint_create()
    event = AuditEvent.objects.get(action="audit.checkpoint", object_id=str(second.pk))
    with triggers_off():
        sql("DELETE FROM audit_checkpointhead WHERE checkpoint_id = %s", [second.pk])
        sql("DELETE FROM audit_checkpoint WHERE id = %s", [second.pk])
    (audit_files.AUDIT_CHECKPOINT_DIR / second.file_name).unlink()

    report = verify(rows=False)
    assert [(p.kind, p.event_id) for p in report.problems] == [("checkpoint", event.pk)]
    assert (
        f"names checkpoint row {second.pk} ({second.file_name}), which is gone" in report.problems[0].detail
    )


def test_a_checkpoint_file_removed_from_the_middle_is_missing_by_number(finished_run, audit_files):
    checkpoint_create()
    submit("Another task")  # a chain moves, so the next checkpoint is not empty
    second = checkpoint_create()
    submit("And another")
    checkpoint_create()
    (audit_files.AUDIT_CHECKPOINT_DIR / second.file_name).unlink()

    n = second.number
    details = [p.detail for p in verify(rows=False).problems]
    assert any(f"checkpoint files {n}..{n} are missing" in d for d in details), details
    assert any(f"checkpoint {n} (row {second.pk}) has no file" in d for d in details), details


# --- 2. a purge must be signed ---------------------------------------------------------------------


@pytest.mark.parametrize("signature", ["none", "another key"])
def test_a_forged_purge_with_a_hand_hashed_purge_event_does_not_hide_a_deleted_chain(
    finished_run, audit_files, signature
):
    name = chain_of(finished_run)
    seal = seal_of(finished_run)
    events = AuditEvent.objects.filter(chain=name).count()
    now = timezone.now()
    body = purge_body(
        chain_name=name,
        last_seq=seal.payload["seq"],
        last_hash=seal.payload["hash"],
        purged_at=now,
        reason="retention",
    )
    forged = (
        Ed25519PrivateKey.generate().sign(audit_chain.canonical(body)).hex() if signature != "none" else ""
    )
    # No trigger is switched off: INSERT is allowed, and the purge row makes the trigger allow DELETE.
    ChainPurge.objects.create(
        chain=name,
        last_seq=seal.payload["seq"],
        last_hash=seal.payload["hash"],
        purged_at=now,
        reason="retention",
        signature=forged,
    )
    tail = AuditEvent.objects.filter(chain=GLOBAL_CHAIN).order_by("-seq").first()
    event = AuditEvent(
        chain=GLOBAL_CHAIN,
        seq=tail.seq + 1,
        prev_hash=tail.hash,
        occurred_at=now,
        actor_type="service",
        actor_id="",
        actor_name="retention",
        action="task.purged",
        object_type="task",
        object_id=str(finished_run.task_id),
        task_id=finished_run.task_id,
        correlation_id=None,
        payload={
            "chains": [
                {
                    "chain": name,
                    "events": events,
                    "last_seq": seal.payload["seq"],
                    "last_hash": seal.payload["hash"],
                }
            ]
        },
    )
    event.hash = expected_hash(event)
    event.save()
    assert sql("DELETE FROM audit_auditevent WHERE chain = %s", [name]) == events

    assert verify(use_checkpoint=False, rows=False).intact is False
    report = verify(rows=False)
    assert [(p.kind, p.chain) for p in report.problems] == [("purge", name)]
    expected = "carries no signature" if signature == "none" else "signature does not hold"
    assert expected in report.problems[0].detail
    assert not verify(chains=[name], rows=False).intact  # the dossier's proof too


# --- 3. the rows the events describe ----------------------------------------------------------------


ROW_CHANGES = {
    "attempt cost": ("UPDATE routing_attempt SET cost_usd = cost_usd + 1 WHERE id = %(attempt)s", "cost_usd"),
    "step response": ("UPDATE routing_step SET response = 'forged' WHERE id = %(step)s", "response (sha256)"),
    "step worker": ("UPDATE routing_step SET worker_slug = 'gamma' WHERE id = %(step)s", "worker"),
    "step vendor": ("UPDATE routing_step SET vendor = 'elsewhere' WHERE id = %(step)s", "vendor"),
    "run answer": (
        "UPDATE routing_run SET final_answer = 'forged' WHERE id = %(run)s",
        "final answer (sha256)",
    ),
    "run cost": ("UPDATE routing_run SET cost_usd = cost_usd + 1 WHERE id = %(run)s", "cost_usd"),
}


@pytest.mark.parametrize("case", list(ROW_CHANGES))
def test_a_changed_row_is_named_against_the_event_that_recorded_it(
    finished_run, audit_files, make_user, case
):
    statement, what = ROW_CHANGES[case]
    step = Step.objects.filter(run=finished_run).order_by("index").first()
    attempt = Attempt.objects.get(step=step, status=Attempt.Status.SUCCEEDED)
    checkpoint_create()
    assert verify().intact
    assert sql(statement, {"attempt": attempt.pk, "step": step.pk, "run": finished_run.pk}) == 1

    report = verify()
    assert not report.intact
    assert {p.kind for p in report.problems} == {"row"}, report.problems
    named = [p for p in report.problems if what in p.detail and p.event_id]
    assert named, report.problems
    event = AuditEvent.objects.get(pk=named[0].event_id)
    assert event.chain == chain_of(finished_run)
    # The dossier shows the difference beside the proof, never "intact".
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    page = client.get(f"/audit/tasks/{finished_run.task_id}/").content.decode()
    assert "NOT INTACT" in page and what.split(" ")[0] in page
    assert verify(chains=[chain_of(finished_run)]).problems == [
        p for p in report.problems if p.chain == chain_of(finished_run)
    ]


def test_an_intact_run_has_no_row_differences_and_its_dossier_says_intact(
    finished_run, audit_files, make_user
):
    checkpoint = checkpoint_create()
    report = verify(chains=[chain_of(finished_run)])
    assert report.intact, report.problems
    assert (
        report.checkpoint_number == checkpoint.number
        and report.inclusions[chain_of(finished_run)]["leaf_index"] == 0
    )
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    page = client.get(f"/audit/tasks/{finished_run.task_id}/").content.decode()
    assert "intact up to event" in page and "NOT INTACT" not in page
    assert (
        f"{chain_of(finished_run)}: leaf 0 of 1 in the log, signed by tree head" in page
    )  # its inclusion proof
    assert (
        report.inclusions[chain_of(finished_run)]["checkpoint"] in page
    )  # the signed note, as its file holds it


# --- 4. the window after the last checkpoint ---------------------------------------------------------


def test_beat_checkpoints_only_when_a_chain_moved_and_the_sealer_signs_a_sealed_run(live_pool, audit_files):
    first = checkpoint_create(only_if_moved=True)
    assert first is not None
    assert checkpoint_create(only_if_moved=True) is None, "nothing moved but the checkpoint's own event"

    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Answer", [])))])
    server.program("alpha", [Reply("42")])
    run = run_now(submit())  # sealed, as beat's sealer does, which signs the grown tree
    assert run.status == RunStatus.SUCCEEDED
    second = Checkpoint.objects.order_by("-number").first()
    assert second.number == first.number + 1 and second.body["tree"]["size"] == 1
    assert verify(chains=[chain_of(run)]).inclusions[chain_of(run)]["checkpoint_number"] == second.number
    assert second.body["previous"] != first.body["previous"]
    assert checkpoint_create(only_if_moved=True) is None, "the sealer's checkpoint signed all of it"


def test_a_run_rewritten_after_the_checkpoint_that_signed_its_seal_is_caught(live_pool, audit_files):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check", "all")))])
    server.program("alpha", [Reply("draft")])
    server.program("beta", [Reply("42")])
    run = run_now(submit())
    checkpoint_create(only_if_moved=True)  # what beat does a few seconds after the run ends
    forged = rewrite_run_and_its_seal(run)

    report = verify(chains=[chain_of(run)], rows=False)
    assert [p.kind for p in report.problems] == ["log"], report.problems
    assert "that end is not leaf 0 of the tree checkpoint" in report.problems[0].detail
    assert forged.seq < report.problems[0].seq


def test_a_finished_run_whose_last_events_and_seal_were_deleted_is_flagged_unsealed(
    finished_run, audit_files
):
    name = chain_of(finished_run)
    seal = seal_of(finished_run)
    last = AuditEvent.objects.filter(chain=name).order_by("-seq").first()
    with triggers_off():
        sql("DELETE FROM audit_auditevent WHERE id = %s OR id = %s", [seal.pk, last.pk])

    report = verify(use_checkpoint=False)
    assert ("unsealed", name) in [(p.kind, p.chain) for p in report.problems], report.problems
    assert any("no event records it" in p.detail for p in report.problems)


# --- 5. the bad event is named exactly ----------------------------------------------------------------


def test_one_event_rewritten_with_its_hash_recomputed_is_named_not_its_successor(finished_run):
    name = chain_of(finished_run)
    target = AuditEvent.objects.get(chain=name, action="step.succeeded", payload__index=0)
    with triggers_off():
        target.payload = {**target.payload, "cost_usd": "0"}
        AuditEvent.objects.filter(pk=target.pk).update(payload=target.payload, hash=expected_hash(target))

    report = verify(rows=False)
    assert [(p.kind, p.event_id, p.seq) for p in report.problems] == [("altered", target.pk, target.seq)]
    assert "its hash was recomputed after a change" in report.problems[0].detail


def test_events_added_after_the_seal_are_named_from_the_first_one(finished_run):
    name = chain_of(finished_run)
    tail = AuditEvent.objects.filter(chain=name).order_by("-seq").first()
    added = AuditEvent(
        chain=name,
        seq=tail.seq + 1,
        prev_hash=tail.hash,
        occurred_at=timezone.now(),
        actor_type="service",
        actor_id="",
        actor_name="engine",
        action="step.succeeded",
        object_type="step",
        object_id="0",
        payload={},
    )
    added.hash = expected_hash(added)
    added.save()  # INSERT is allowed; the sealed head refuses appends through the app only

    report = verify(rows=False)
    assert [(p.kind, p.event_id) for p in report.problems] == [("added", added.pk)]
    assert f"closed the chain at seq {tail.seq}" in report.problems[0].detail


# --- 6. one run's proof alone ----------------------------------------------------------------------


def test_one_runs_proof_reads_the_same_few_rows_however_large_the_record(
    live_pool, audit_files, django_assert_max_num_queries
):
    server = live_pool["server"]

    def one_run() -> Run:
        server.program("conductor", [Reply(plan_json(("alpha", "Answer", [])))])
        server.program("alpha", [Reply("42")])
        return run_now(submit())

    run = one_run()  # the sealer signs a tree head after each run's seal
    one_run()  # a tree of two leaves: its audit path is one node
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as alone:
        assert verify(chains=[chain_of(run)]).intact
    for _ in range(6):
        one_run()
    with django_assert_max_num_queries(len(alone.captured_queries)):
        report = verify(chains=[chain_of(run)])
    assert (
        report.intact
        and report.checkpoint_number == 8
        and len(report.inclusions[chain_of(run)]["audit_path"]) == 3
    )
    assert Checkpoint.objects.count() == 8 and Decimal(run.cost_usd) > 0


# --- 5. every value an auditor reads -----------------------------------------------------------------

VALUE_CHANGES = {
    "task classification": (
        "UPDATE routing_task SET classification = 'public' WHERE id = %(task)s",
        "classification",
    ),
    "task text": ("UPDATE routing_task SET text = 'forged' WHERE id = %(task)s", "text (sha256)"),
    "task cost": ("UPDATE routing_task SET cost_usd = cost_usd + 1 WHERE id = %(task)s", "cost_usd"),
    "task answer": ("UPDATE routing_task SET final_answer = 'forged' WHERE id = %(task)s", "final answer"),
    "decision plan": (
        "UPDATE routing_decision SET plan = jsonb_set(plan, '{steps,0,worker}', '\"gamma\"') WHERE run_id = %(run)s",
        "plan (sha256)",
    ),
    "decision raw output": (
        "UPDATE routing_decision SET raw_output = 'forged' WHERE run_id = %(run)s",
        "raw_output (sha256)",
    ),
    "step instruction": (
        "UPDATE routing_step SET instruction = 'forged' WHERE id = %(step)s",
        "instruction (sha256)",
    ),
    "step messages emptied": (
        "UPDATE routing_step SET messages_sent = NULL WHERE id = %(step)s",
        "messages (sha256)",
    ),
    "task purged by hand": (
        "UPDATE routing_task SET purged_at = now() WHERE id = %(task)s",
        "no task.purged event",
    ),
}


@pytest.mark.parametrize("case", list(VALUE_CHANGES))
def test_a_value_the_dossier_shows_is_bound_to_an_event(finished_run, audit_files, make_user, case):
    """Each column the dossier and the task page show as fact, changed as a superuser would: the full
    verification and the run's proof name it, and the dossier does not say intact."""
    statement, what = VALUE_CHANGES[case]
    step = Step.objects.filter(run=finished_run).order_by("index").first()
    checkpoint_create()
    assert verify().intact, verify().problems
    assert sql(statement, {"task": finished_run.task_id, "step": step.pk, "run": finished_run.pk}) >= 1

    report = verify()
    assert not report.intact
    assert {p.kind for p in report.problems} == {"row"}, report.problems
    assert any(what in p.detail for p in report.problems), report.problems
    proof = verify(chains=[chain_of(finished_run)])
    assert any(what in p.detail for p in proof.problems), proof.problems
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    page = client.get(f"/audit/tasks/{finished_run.task_id}/").content.decode()
    assert "NOT INTACT" in page


def test_a_runs_rows_deleted_while_its_events_remain_are_named(finished_run, audit_files):
    checkpoint_create()
    run = finished_run.pk
    for statement in (
        "DELETE FROM routing_attempt WHERE step_id IN (SELECT id FROM routing_step WHERE run_id = %(run)s)",
        "DELETE FROM routing_step WHERE run_id = %(run)s",
        "DELETE FROM routing_decision WHERE run_id = %(run)s",
        "DELETE FROM routing_run WHERE id = %(run)s",
    ):
        sql(statement, {"run": run})
    report = verify()
    gone = [p for p in report.problems if p.chain == chain_of(finished_run) and "is gone" in p.detail]
    assert gone, report.problems
    # The task's totals no longer add up to its runs' either.
    assert any("add up to" in p.detail for p in report.problems), report.problems


def test_a_step_row_deleted_is_named_against_its_events(finished_run, audit_files):
    step = Step.objects.filter(run=finished_run).order_by("index").last()
    sql("DELETE FROM routing_attempt WHERE step_id = %s", [step.pk])
    sql("DELETE FROM routing_step WHERE id = %s", [step.pk])
    problems = verify(chains=[chain_of(finished_run)]).problems
    assert any(p.detail == f"step {step.pk} is gone" and p.event_id for p in problems), problems


def test_after_a_purge_the_rows_it_kept_are_bound_to_its_event(finished_run, audit_files, settings):
    """A purge keeps who was called, at what vendor, for what cost; its event records them, so they
    cannot be changed afterwards, although the run chains that bound them are gone."""
    from audit.services import Actor
    from governance.retention import task_purge

    checkpoint_create()
    task = finished_run.task
    task_purge(task=task, actor=Actor.service("retention"), now=timezone.now())
    assert verify().intact, verify().problems
    step = Step.objects.filter(run=finished_run).order_by("index").first()
    attempt = Attempt.objects.filter(step=step).first()
    sql("UPDATE routing_step SET vendor = 'elsewhere' WHERE id = %s", [step.pk])
    sql("UPDATE routing_attempt SET cost_usd = 0 WHERE id = %s", [attempt.pk])
    problems = verify().problems
    named = {p.detail.split(" (kept")[0] for p in problems if "kept after the purge" in p.detail}
    assert named == {f"step {step.pk}", f"attempt {attempt.pk}"}, problems


def test_a_role_granted_by_sql_is_named(audit_files, make_user):
    """A grant that no event records: a row inserted into auth_user_groups, a flag set by UPDATE."""
    from django.contrib.auth.models import Group

    make_user("ann", Role.AUDITOR)
    bob = make_user("bob")
    admin = Group.objects.get_or_create(name=Role.ADMIN)[0]
    assert verify(use_checkpoint=False).intact
    sql("INSERT INTO auth_user_groups (user_id, group_id) VALUES (%s, %s)", [bob.pk, admin.pk])
    sql("UPDATE auth_user SET is_superuser = true WHERE username = 'ann'")
    problems = [p for p in verify(use_checkpoint=False).problems if p.kind == "grant"]
    details = " | ".join(p.detail for p in problems)
    assert "user bob's roles are ['admin'] in auth_user_groups; the events record []" in details
    assert "user ann's is_superuser is True in auth_user; the events record False" in details
    # A grant through the app is recorded, and verifies.
    sql("DELETE FROM auth_user_groups WHERE user_id = %s AND group_id = %s", [bob.pk, admin.pk])
    sql("UPDATE auth_user SET is_superuser = false WHERE username = 'ann'")
    from audit.grants import user_set_roles

    user_set_roles(user=bob, roles=[Role.ADMIN])
    assert verify(use_checkpoint=False).intact, verify(use_checkpoint=False).problems


def test_a_checkpoint_row_edited_with_its_signature_kept_fails_both_verifiers(finished_run, audit_files):
    """The full verification and a run's proof read a checkpoint row the same way."""
    checkpoint = checkpoint_create()
    with triggers_off():
        sql(
            "UPDATE audit_checkpoint SET body = jsonb_set(body, '{created_at}', '\"2000-01-01T00:00:00+00:00\"') WHERE id = %s",
            [checkpoint.pk],
        )
    full = verify(rows=False)
    proof = verify(chains=[chain_of(finished_run)], rows=False)
    assert any("differs from its file" in p.detail for p in full.problems), full.problems
    assert not proof.intact, proof.problems


@pytest.mark.parametrize(
    ("statement", "what"),
    [
        ("DELETE FROM routing_taskexposure WHERE task_id = %(task)s", "the exposure map leaves"),
        (
            "INSERT INTO routing_taskexposure (task_id, vendor, classification, task_created_at, first_at, last_at)"
            " VALUES (%(task)s, 'elsewhere', 'internal', now(), now(), now())",
            "no step or judge of its runs reached 'elsewhere'",
        ),
        (
            "UPDATE routing_taskexposure SET classification = 'public' WHERE task_id = %(task)s",
            "the exposure map records it as 'public'",
        ),
    ],
    ids=["vendor hidden", "vendor added", "class changed"],
)
def test_the_exposure_map_is_bound_to_the_steps_that_reached_each_vendor(
    finished_run, audit_files, statement, what
):
    from routing.folds import fold

    fold()
    assert verify(use_checkpoint=False).intact, verify(use_checkpoint=False).problems
    assert sql(statement, {"task": finished_run.task_id}) >= 1
    problems = verify(use_checkpoint=False).problems
    assert any(what in p.detail for p in problems), problems
