"""What a run costs the database, pinned: statements and transactions of a plan and three steps
(as NetBox pins its views' queries). A change that adds some says why in its commit."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from routing import engine
from routing.engine import RunExecution
from routing.models import Attempt, Run, RunStatus
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import submit

pytestmark = pytest.mark.django_db(transaction=True)

# A plan by the LLM conductor and three steps, each seeing the one before (so one is ready at a
# time), each answered at the first call: one statement per write, each its own transaction. The
# claim (with the read before it that draws the first plan's ids), the plan with the first step's
# start, each step's success with the next step's start, and the last step's success with the run's
# end (its seals and the row that leaves it waiting for a fold of the rollups).
STATEMENTS = 6
TRANSACTIONS = 6


def program(server) -> None:
    server.program(
        "conductor", [Reply(plan_json(("alpha", "A", []), ("beta", "B", [0]), ("gamma", "C", [1])))]
    )
    for worker in ("alpha", "beta", "gamma"):
        server.program(worker, [Reply(worker)])


def test_a_sequential_run_of_three_steps_runs_on_one_connection_within_its_pinned_statements(
    live_pool, no_fold_after_runs
):
    server = live_pool["server"]
    program(server)
    engine.execute_run(submit("warm up").pk)  # first use: the conductor is built, litellm warms up
    program(server)
    run = submit("Three steps")

    with CaptureQueriesContext(connection) as captured:
        engine.execute_run(run.pk)

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    sql = [q["sql"] for q in captured.captured_queries]
    # Every step ran here, on this thread's connection: no thread with a connection of its own.
    inserts = [s for s in sql if 'INSERT INTO "routing_attempt"' in s]
    assert len(inserts) == Attempt.objects.filter(step__run=run).count() == 3
    transactions = count_transactions(sql)
    assert len(sql) <= STATEMENTS, f"{len(sql)} statements (pinned: {STATEMENTS})"
    assert transactions <= TRANSACTIONS, f"{transactions} transactions (pinned: {TRANSACTIONS})"
    # Every write is one statement, its own transaction (the change with its events, on the run as this
    # process last read it): the claim, the plan with its steps and the first step's start, each step's
    # success with the next step's start, and the last step's success with the run's end.
    one_statement = [s for s in sql if s.startswith("WITH run_as_assumed AS")]
    assert len(one_statement) == 5, one_statement
    assert '"claim_epoch": 1' in one_statement[0] and 'INSERT INTO "routing_decision"' in one_statement[1]
    # The claim's commit alone does not wait for the WAL's flush (the plan's, next, flushes it too): for
    # its own transaction only, the connection's commits wait again after it.
    no_flush = "set_config('synchronous_commit', 'off', true)"
    assert [no_flush in s for s in one_statement] == [True, False, False, False, False]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    assert one_statement[1].count('INSERT INTO "routing_attempt"') == 1  # step 0 started with the plan
    assert one_statement[1].count('"action": "step.started"') == 1
    plan = sql.index(one_statement[1])
    assert sql[plan : plan + 3] == one_statement[1:4]  # nothing read or written between the steps
    # The last step's success and the run's end: its answer, score, totals, the task's, its sealing
    # event and its pending seal (the global chain is not in it), and the row that leaves the run
    # waiting for a fold of the rollups: one statement, its own transaction (no receiver of
    # run_finished writes for a live run).
    end = one_statement[4]
    assert sql[plan + 3 :] == [end]
    assert end.index('"action": "step.succeeded"') < end.index('"action": "run.succeeded"')
    assert 'INSERT INTO "audit_pendingseal"' in end and 'UPDATE "routing_attempt"' in end
    assert '"action": "run.sealed"' not in end
    assert "UPDATE routing_task" in end and "INSERT INTO routing_pendingrollup" in end
    assert [s for s in sql if "routing_pendingrollup" in s] == [end]
    assert not [s for s in sql if "routing_usagerollup" in s or "routing_runrollup" in s]
    # The run chain is sealed by its last event's append; the global chain is left to the sealer: no
    # statement of their own (the claim's read, first, reads the run chain's head).
    assert not [s for s in sql[1:] if "audit_chainhead" in s and s not in one_statement]

    # The writes are prepared statements of this connection, planned once and reused (a generic plan):
    # run again, the same statements are not prepared anew, though its totals need a larger integer
    # type (integers go as bigint: a parameter's type is part of what psycopg prepared).
    prepared = _prepared()
    assert prepared["WITH run_as_assumed AS"] >= 4, prepared
    server.program(
        "conductor", [Reply(plan_json(("alpha", "A", []), ("beta", "B", [0]), ("gamma", "C", [1])))]
    )
    for worker in ("alpha", "beta", "gamma"):
        server.program(worker, [Reply(worker, prompt_tokens=40_000, completion_tokens=3)])
    engine.execute_run(submit("Three more steps").pk)
    assert Run.objects.latest("pk").input_tokens > 2**16
    again = _prepared()
    assert again["count"] == prepared["count"], (prepared, again)


def _prepared() -> dict[str, int]:
    """This connection's prepared statements: how many, how many are engine writes (WITH run_as_assumed AS ...)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER (WHERE statement LIKE 'WITH run_as_assumed AS%%') FROM pg_prepared_statements"
        )
        count, writes = cursor.fetchone()
    return {"count": count, "WITH run_as_assumed AS": writes}


def count_transactions(sql: list[str]) -> int:
    """BEGIN ... COMMIT counts once; a statement outside one (autocommit) is a transaction of its own."""
    count, inside = 0, False
    for statement in sql:
        word = statement.strip().upper()
        if word == "BEGIN":
            inside = True
        elif word in ("COMMIT", "ROLLBACK"):
            inside = False
            count += 1
        elif not inside:
            count += 1
    return count


@pytest.mark.parametrize("written", [False, True], ids=["nothing written at its end", "a receiver writes"])
def test_a_runs_end_is_a_transaction_with_run_finished_only_where_a_receiver_writes(
    live_pool, no_fold_after_runs, monkeypatch, caplog, written
):
    """A live run's end is its one statement, committed before run_finished's receivers hear of it (a
    receiver that fails then is logged: the run has ended); where a receiver writes for the run's kind
    (routing.signals.writes_at_end), the end and the receivers are one transaction, and a receiver
    that fails takes the end back with it."""
    from routing import signals
    from routing.engine import run_end

    monkeypatch.setattr(signals, "_WRITTEN_AT_END", {Run.Kind.LIVE} if written else set())
    server = live_pool["server"]
    program(server)
    engine.execute_run(submit("warm up").pk)  # first use: the conductor is built, litellm warms up
    program(server)
    run = submit("Three steps")
    heard: list[tuple[bool, str]] = []

    def receiver(sender, *, run, **kwargs):
        # What another connection sees of the run when the receiver hears of its end.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL")
            in_transaction = cursor.fetchone()[0]
        heard.append((connection.in_atomic_block and in_transaction, Run.objects.get(pk=run.pk).status))
        raise RuntimeError("the receiver failed")

    signals.run_finished.connect(receiver, sender=Run, dispatch_uid="test.receiver")
    try:
        claimed, last = _ready_to_finish(run)
        if written:
            with pytest.raises(RuntimeError, match="the receiver failed"):
                run_end.finish_run(claimed, last)
        else:
            with caplog.at_level(logging.ERROR, logger="routing.engine.events"):
                run_end.finish_run(claimed, last)
            assert f"run {run.pk} ended; a receiver of run_finished failed after it" in caplog.text
    finally:
        signals.run_finished.disconnect(sender=Run, dispatch_uid="test.receiver")
    run.refresh_from_db()
    # The receiver heard of the end inside its transaction (the end's writes not yet committed) or
    # after the end's own commit; a failing receiver takes the end back only in the first case.
    assert heard == [(written, RunStatus.SUCCEEDED)]
    assert run.status == (RunStatus.RUNNING if written else RunStatus.SUCCEEDED)


def _ready_to_finish(run: Run) -> tuple[RunExecution, object]:
    """The run claimed and its plan executed by the engine, its end left to the test."""
    from routing.engine import claim, planning, schedule

    claimed = claim.claim_run(run.pk)
    assert claimed is not None
    recorded = planning.ensure_plan(claimed, parent_step=None, depth=0)
    return claimed, schedule.schedule_steps(claimed, recorded)
