"""Retention: a finished task past its data class's period loses its content and its runs' audit chains,
unless a legal hold stops it; the record still verifies afterwards."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.checkpoints import checkpoint_create
from audit.models import GLOBAL_CHAIN, AuditEvent, ChainPurge, LegalHold, PendingSeal
from audit.services import Actor, legal_hold_place, legal_hold_release
from audit.verify import verify
from governance.retention import PURGED, retention_purge
from review.annotations import services as review
from routing.models import Annotation, Attempt, Decision, Run, RunStatus, Step, Task, Worker
from tests.audit.support import audit_verify, run_now, submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished(live_pool):
    """`finished(days_ago, classification)`: a task that ran two steps and finished that long ago."""
    server = live_pool["server"]
    Worker.objects.update(data_classes=["public", "internal", "confidential", "restricted"])

    def make(days_ago: float, classification: str = "internal") -> Task:
        tag = uuid.uuid4().hex  # appears in the task's text, instructions and answers, nowhere else
        plan = plan_json(("alpha", f"Restate the date of merger {tag}", []), ("beta", "Check", "all"))
        server.program("conductor", [Reply(plan)])
        server.program("alpha", [Reply(f"draft: merger {tag} closes on 3 March")])
        server.program("beta", [Reply(f"3 March (merger {tag})")])
        run = run_now(submit(f"When does merger {tag} close?", classification=classification, reference="3"))
        assert run.status == RunStatus.SUCCEEDED, run.error
        Task.objects.filter(pk=run.task_id).update(finished_at=timezone.now() - timedelta(days=days_ago))
        task = Task.objects.get(pk=run.task_id)
        task.tag = tag
        return task

    return make


def chain_of(task: Task) -> str:
    return f"run:{task.runs.get().correlation_id}"


def mentions(table: str, text: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} AS t WHERE t::text LIKE %s", [f"%{text}%"])  # noqa: S608
        return cursor.fetchone()[0]


def assert_untouched(task: Task) -> None:
    task.refresh_from_db()
    assert task.purged_at is None and task.text == f"When does merger {task.tag} close?"
    assert task.final_answer == f"3 March (merger {task.tag})"
    assert AuditEvent.objects.filter(chain=chain_of(task)).count() == 8
    assert not ChainPurge.objects.filter(chain=chain_of(task)).exists()
    assert Step.objects.filter(run__task=task, response=task.final_answer).exists()
    assert mentions("audit_auditevent", task.tag) > 0


def assert_purged(task: Task) -> None:
    task.refresh_from_db()
    assert task.purged_at is not None
    assert (task.text, task.final_answer, task.reference) == (PURGED, PURGED, None)
    steps = list(Step.objects.filter(run__task=task))
    assert len(steps) == 2
    assert all(s.instruction == PURGED and s.response == PURGED and s.messages_sent is None for s in steps)
    decision = Decision.objects.get(run__task=task)
    assert (decision.raw_output, decision.plan, decision.prompt, decision.alternatives) == (
        PURGED,
        None,
        [],
        [],
    )
    assert Run.objects.get(task=task).final_answer == PURGED
    assert not AuditEvent.objects.filter(chain=chain_of(task)).exists()
    # Nothing of its text, instructions or answers is left, in the record or in the task tables.
    tables = ("audit_auditevent", "routing_task", "routing_run", "routing_decision", "routing_step")
    for table in (*tables, "routing_annotation"):
        assert mentions(table, task.tag) == 0, f"{table} still holds the purged task's content"


def test_a_task_past_its_retention_is_purged_and_the_record_still_verifies(finished, audit_files):
    kept = finished(days_ago=30)
    old = finished(days_ago=366)
    # A reviewer's comment that quotes what it reviewed goes with the content; the verdict stays.
    review.annotation_add(
        verdict=review.Verdict(
            run_id=Run.objects.get(task=old).pk, verdict="wrong", comment=f"says {old.tag}"
        ),
        user=None,
    )
    name = chain_of(old)
    seal = AuditEvent.objects.get(chain=GLOBAL_CHAIN, action="run.sealed", payload__chain=name)
    events_in_chain = AuditEvent.objects.filter(chain=name).count()
    checkpoint_create()  # signed before the purge: it must still verify after it

    purged = retention_purge()

    assert [t.pk for t in purged] == [old.pk]
    assert_purged(old)
    assert Annotation.objects.get(run__task=old).verdict == "wrong"
    assert_untouched(kept)
    purge = ChainPurge.objects.get()
    assert (purge.chain, purge.last_seq, purge.last_hash) == (name, seal.payload["seq"], seal.payload["hash"])
    assert purge.reason == "retention"
    event = AuditEvent.objects.get(action="task.purged")
    assert (event.chain, event.actor_type, event.actor_name) == (GLOBAL_CHAIN, "service", "retention")
    assert event.task_id == old.pk and event.object_id == str(old.pk)
    assert event.payload["classification"] == "internal" and event.payload["retention_days"] == 365
    assert event.payload["chains"] == [
        {
            "chain": name,
            "events": events_in_chain,
            "last_seq": seal.payload["seq"],
            "last_hash": seal.payload["hash"],
        }
    ]

    report = verify()
    assert report.intact, report.summary()
    assert verify(chains=[name]).intact  # as the dossier checks one task's chains
    code, out, _ = audit_verify()
    assert code == 0 and "intact up to event" in out and "verifies" in out
    assert retention_purge() == []  # nothing more is due


def test_a_legal_hold_stops_the_purge_until_it_is_released(finished, make_user):
    task = finished(days_ago=800)
    counsel = Actor.for_user(make_user("carol", "admin"))
    legal_hold_place(task=task, actor=counsel, reason="litigation 2026-14")

    assert retention_purge() == []
    assert_untouched(task)

    assert legal_hold_release(task=task, actor=counsel) == 1
    assert LegalHold.objects.get(task_id=task.pk).released_by == "carol"
    assert [t.pk for t in retention_purge()] == [task.pk]
    assert_purged(task)
    actions = list(
        AuditEvent.objects.filter(chain=GLOBAL_CHAIN, task_id=task.pk)
        .order_by("seq")
        .values_list("action", flat=True)
    )
    assert actions == ["run.sealed", "legalhold.placed", "legalhold.released", "task.purged"]
    assert verify().intact


def test_one_of_two_holds_released_still_holds(finished):
    task = finished(days_ago=800)
    legal_hold_place(task=task, actor=Actor.service("legal"), reason="first")
    LegalHold.objects.create(task_id=task.pk, reason="second", placed_by="legal")
    LegalHold.objects.filter(task_id=task.pk, reason="first").update(
        released_at=timezone.now(), released_by="legal"
    )

    assert retention_purge() == []
    assert_untouched(task)


def test_tasks_younger_than_their_retention_are_untouched(finished, settings):
    internal = finished(days_ago=364)
    confidential = finished(days_ago=400, classification="confidential")  # kept 730 days

    assert retention_purge() == []
    assert_untouched(internal)
    assert_untouched(confidential)

    # The period is per data class and read from the settings.
    settings.RETENTION_DAYS = {**settings.RETENTION_DAYS, "confidential": 399}
    assert [t.pk for t in retention_purge()] == [confidential.pk]
    assert_purged(confidential)
    assert_untouched(internal)
    # A day later the internal one is due too.
    assert [t.pk for t in retention_purge(now=timezone.now() + timedelta(days=2))] == [internal.pk]
    assert_purged(internal)
    assert verify().intact


def test_a_task_that_has_not_finished_is_never_purged(live_pool):
    run = submit("When does the merger close?")
    Task.objects.filter(pk=run.task_id).update(created_at=timezone.now() - timedelta(days=2000))

    assert retention_purge(now=timezone.now() + timedelta(days=5000)) == []
    task = Task.objects.get(pk=run.task_id)
    assert task.purged_at is None and task.text == "When does the merger close?"
    assert AuditEvent.objects.filter(chain=f"run:{run.correlation_id}").count() == 1
    assert not Attempt.objects.exists()


def test_a_chain_logged_and_signed_then_purged_later_still_verifies(live_pool, audit_files):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Answer", [])))])
    server.program("alpha", [Reply("42")])
    run = submit("What is 6 * 7?")
    checkpoint = checkpoint_create()
    name = f"run:{run.correlation_id}"
    run = run_now(run)  # sealed into the log, and signed
    assert PendingSeal.objects.get(chain=name).leaf_index == 0
    Task.objects.filter(pk=run.task_id).update(finished_at=timezone.now() - timedelta(days=400))

    assert [t.pk for t in retention_purge()] == [run.task_id]

    assert not AuditEvent.objects.filter(chain=name).exists()
    report = verify()
    assert report.intact and report.checkpoint_number > checkpoint.number, report.summary()
    assert PendingSeal.objects.get(chain=name).leaf_index == 0  # its leaf outlives its events
