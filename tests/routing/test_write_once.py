"""A change written as one statement (engine.executor, its compiled form): written only when the run is
as this process last read it; when something moved under it (the totals, the chain's head), nothing of
the statement is written and the change is built again and applied plainly, on what its lock reads."""

from __future__ import annotations

import threading
from decimal import Decimal

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from audit import chain as audit_chain
from audit.models import AuditEvent
from audit.services import ENGINE, event_record
from audit.verify import verify
from routing import engine
from routing.models import Attempt, Decision, Run, RunStatus, Step, StepStatus, Worker
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import assert_rollups_exact, run_now, submit

pytestmark = pytest.mark.django_db(transaction=True)


def two_steps(server, alpha) -> None:
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check", [0])))])
    server.program("alpha", alpha)
    server.program("beta", [Reply("checked", prompt_tokens=100, completion_tokens=10)])


def one_statement_writes(sql: list[str]) -> list[str]:
    return [s for s in sql if s.startswith("WITH run_as_assumed AS")]


def executed_in_thread(run: Run) -> tuple[threading.Thread, list[BaseException | None]]:
    """A thread (not started) that executes the run on a connection of its own, and the list that
    gets what it raised, or None."""
    outcome: list[BaseException | None] = []

    def execute() -> None:
        try:
            engine.execute_run(run.pk)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            outcome.append(exc)
        finally:
            connections.close_all()

    return threading.Thread(target=execute), outcome


def waits_for_a_lock(
    probe: psycopg.Connection, thread: threading.Thread, query: str, blocker: int | None = None
) -> bool:
    """Whether a statement like `query` comes to wait for a lock while `thread` runs (10 s at most):
    one that the backend `blocker` holds, if given."""
    for _ in range(500):
        if probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE %s "
            "AND (%s::int IS NULL OR %s::int = ANY (pg_blocking_pids(pid)))",
            [query, blocker, blocker],
        ).fetchone()[0]:
            return True
        thread.join(0.02)
    return False


def test_totals_moved_by_another_writer_are_added_to_not_overwritten(live_pool):
    """While step 0's call is out, something else adds to the run's totals: the success's statement
    (guarded by the totals this process read) writes nothing, and the fenced path adds the call's cost
    to the totals as they are."""
    server = live_pool["server"]
    outside = Decimal("0.5000000000")

    def alpha(body: dict) -> Reply:
        try:
            Run.objects.filter(correlation_id=run.correlation_id).update(cost_usd=outside, input_tokens=7)
        finally:
            connection.close()  # the server's thread, with a connection of its own
        return Reply("draft", prompt_tokens=100, completion_tokens=10)

    two_steps(server, alpha)
    run = submit()
    with CaptureQueriesContext(connection) as captured:
        engine.execute_run(run.pk)
    run.refresh_from_db()

    assert run.status == RunStatus.SUCCEEDED, run.error
    paid = Attempt.objects.filter(step__run=run).aggregate(c=Sum("cost_usd"), i=Sum("input_tokens"))
    assert paid["c"] > 0
    assert run.cost_usd == outside + paid["c"]  # the outside change kept, both calls added to it
    assert run.input_tokens == 7 + paid["i"]
    sql = [q["sql"] for q in captured.captured_queries]
    # The claim, and the plan with step 0's start, were one statement each; step 0's success (with step
    # 1's start) found the totals moved, wrote nothing, and was applied plainly; step 1's success with
    # the run's end, on what that lock read, one statement.
    assert len(one_statement_writes(sql)) == 4
    steps = list(Step.objects.filter(run=run).order_by("index"))
    assert [s.status for s in steps] == [StepStatus.SUCCEEDED, StepStatus.SUCCEEDED]
    for step in steps:  # one attempt each, one event per change: nothing written twice
        assert step.attempts.count() == 1
        assert (
            AuditEvent.objects.filter(
                object_type="step", object_id=str(step.pk), action="step.succeeded"
            ).count()
            == 1
        )
        assert (
            AuditEvent.objects.filter(
                object_type="step", object_id=str(step.pk), action="step.started"
            ).count()
            == 1
        )
    # The chain is intact; what the verifier reports is the outside change itself (the run's totals
    # no longer add up to its calls), not anything the engine wrote.
    report = verify(chains=[audit_chain.run_chain(run.correlation_id)])
    assert [(p.kind, "cost_usd" in p.detail) for p in report.problems] == [("row", True)]


def test_a_chain_head_moved_by_another_process_is_read_under_its_lock_and_built_on(live_pool):
    """Another process appends to the run's chain while step 0's call is out (this process does not
    see it): the success's statement, built on the head this process remembers, writes nothing at all
    (not the step, not the attempt); the fenced path builds on the real head, and the chain verifies."""
    server = live_pool["server"]

    def alpha(body: dict) -> Reply:
        try:
            with transaction.atomic():
                event_record(
                    actor=ENGINE,
                    action="record.viewed",
                    obj=run,
                    task_id=run.task_id,
                    correlation_id=run.correlation_id,
                    payload={"view": "another process"},
                )
        finally:  # another process: the engine's execution does not see it
            connection.close()
        return Reply("draft")

    two_steps(server, alpha)
    run = submit()  # before the call: alpha's callback names it
    run = run_now(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    events = list(AuditEvent.objects.filter(correlation_id=run.correlation_id).order_by("seq"))
    actions = [e.action for e in events]
    viewed = actions.index("record.viewed")
    assert actions[viewed - 1] == "step.started"  # step 0 started before the other process wrote
    assert actions[viewed + 1 : viewed + 3] == ["step.succeeded", "step.started"]  # then built on it
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    report = verify(chains=[audit_chain.run_chain(run.correlation_id)])
    assert report.intact, report.problems
    assert_rollups_exact(run)
    assert Attempt.objects.filter(step__run=run).count() == 2


def test_a_worker_disabled_while_an_earlier_step_runs_is_not_called(live_pool):
    """The workers' stamp rides on every one-statement write, like the rules': a worker disabled while
    step 0's call is out (after the plan named it) fails its step before any call, as not enabled."""
    server = live_pool["server"]

    def alpha(body: dict) -> Reply:
        try:
            Worker.objects.filter(slug="beta").update(enabled=False)
        finally:
            connection.close()
        return Reply("draft")

    two_steps(server, alpha)
    run = run_now(submit())

    assert run.status == RunStatus.FAILED and run.stop_reason == "unknown_worker", run.error
    assert "worker 'beta', which is not registered or not enabled" in run.error
    assert not server.requests_for("beta")
    steps = {s.index: s for s in Step.objects.filter(run=run)}
    assert steps[0].status == StepStatus.SUCCEEDED and steps[1].status == StepStatus.FAILED
    assert not steps[1].attempts.exists()
    report = verify(chains=[audit_chain.run_chain(run.correlation_id)])
    assert report.intact, report.problems


def test_the_last_steps_success_ends_the_run_in_its_statement_or_apart_when_the_run_moved(
    live_pool, no_fold_after_runs
):
    """The last step's success and the run's end are one change, one statement when the run is as this
    process last read it. When something moved it during that step's call, nothing of that statement
    is written: the same change is applied plainly, in one transaction, each row and event once."""
    server = live_pool["server"]
    outside = Decimal("0.2500000000")
    moved = []

    def beta(body: dict) -> Reply:
        if moved:  # the second run's last call: its totals move while it is out
            try:
                Run.objects.filter(correlation_id=run.correlation_id).update(cost_usd=outside)
            finally:
                connection.close()  # the server's thread, with a connection of its own
        return Reply("checked", prompt_tokens=100, completion_tokens=10)

    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check", [0])))] * 2)
    server.program("alpha", [Reply("draft")] * 2)
    server.program("beta", beta)
    for run in (submit(), submit()):
        with CaptureQueriesContext(connection) as captured:
            engine.execute_run(run.pk)
        run.refresh_from_db()
        sql = [q["sql"] for q in captured.captured_queries]
        writes = one_statement_writes(sql)
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert run.final_answer == "checked"
        last = Step.objects.get(run=run, index=1)
        assert last.status == StepStatus.SUCCEEDED and last.response == "checked"
        if not moved:
            # The claim, the plan with step 0's start, its success with step 1's start, and step 1's
            # success with the run's end: four statements, nothing else written.
            assert len(writes) == 4 and "BEGIN" not in sql
            assert '"action": "step.succeeded"' in writes[-1] and '"action": "run.succeeded"' in writes[-1]
            assert_rollups_exact(run)  # the run's totals its calls', the task's its run's
            assert not verify(chains=[audit_chain.run_chain(run.correlation_id)]).problems
            moved.append(run)
            continue
        # Step 1's success with the end, tried, wrote nothing; the same change was then applied plainly,
        # in one transaction after it.
        assert len(writes) == 4 and sql.count("BEGIN") == 1
        assert '"action": "run.succeeded"' in writes[3]
        assert sql.index(writes[3]) < sql.index("BEGIN")
        assert run.cost_usd == outside + Attempt.objects.get(step=last).cost_usd
        for step in Step.objects.filter(run=run):
            for action in ("step.started", "step.succeeded"):
                assert (
                    AuditEvent.objects.filter(
                        object_type="step", object_id=str(step.pk), action=action
                    ).count()
                    == 1
                )
        assert (
            AuditEvent.objects.filter(correlation_id=run.correlation_id, action="run.succeeded").count() == 1
        )
        report = verify(chains=[audit_chain.run_chain(run.correlation_id)])
        assert [(p.kind, "cost_usd" in p.detail) for p in report.problems] == [("row", True)]
    for run in Run.objects.all():  # the task's totals: its run's, as its end found them
        assert run.task.cost_usd == run.cost_usd and run.task.input_tokens == run.input_tokens


def test_a_cost_finer_than_the_column_stores_keeps_the_next_writes_in_one_statement(
    live_pool, no_fold_after_runs
):
    """A call can cost more decimal places than the run's totals keep (a price per million tokens times
    a few tokens): the process must assume the totals as the column stored them, or every later guard
    misses and each write falls back to a fenced transaction."""
    server = live_pool["server"]
    Worker.objects.filter(slug="alpha").update(
        input_usd_per_mtok=Decimal("0.1234567891"), output_usd_per_mtok=Decimal("0.3333333333")
    )
    two_steps(server, [Reply("draft", prompt_tokens=7, completion_tokens=3)])
    run = submit()
    with CaptureQueriesContext(connection) as captured:
        engine.execute_run(run.pk)
    run.refresh_from_db()

    assert run.status == RunStatus.SUCCEEDED, run.error
    alpha = Attempt.objects.get(step__run=run, step__worker_slug="alpha")
    assert alpha.cost_usd > 0
    sql = [q["sql"] for q in captured.captured_queries]
    # The claim, the plan with step 0's start, its success with step 1's start, and step 1's success with
    # the run's end (on the totals as rounded): one statement each, no transaction of several.
    assert len(one_statement_writes(sql)) == 4
    assert "BEGIN" not in sql
    calls = Attempt.objects.filter(step__run=run).aggregate(c=Sum("cost_usd"))["c"]
    plans = Decision.objects.filter(run=run).aggregate(c=Sum("cost_usd"))["c"]
    assert run.cost_usd == calls + plans


@pytest.mark.parametrize("compiled", [True, False], ids=["one statement", "plain"])
def test_a_runs_end_never_waits_for_the_global_chain(live_pool, settings, compiled):
    """Another transaction holds the global chain's head (a sealer's batch, a human action): a run still
    ends, each way its end is written, its chain sealed and its seal left pending for the sealer,
    which appends it once the head is free."""
    from audit.models import GLOBAL_CHAIN, PendingSeal
    from audit.seals import seal_pending

    settings.CONDUCTOR_ONE_STATEMENT_WRITES = compiled
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", [])))])
    server.program("alpha", [Reply("draft")])
    run = submit()
    thread, outcome = executed_in_thread(run)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO audit_chainhead (chain, seq, hash, sealed, updated_at) VALUES (%s, 0, %s, false, now()) "
            "ON CONFLICT (chain) DO NOTHING",
            [GLOBAL_CHAIN, "0" * 64],
        )
        cursor.execute("SELECT 1 FROM audit_chainhead WHERE chain = %s FOR UPDATE", [GLOBAL_CHAIN])
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the run's end waited for the global chain's head"
    assert outcome == [None], outcome
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    chain = audit_chain.run_chain(run.correlation_id)
    pending = PendingSeal.objects.get(chain=chain)
    assert pending.seal_event_id is None
    assert seal_pending() == 1
    seal = AuditEvent.objects.get(chain=GLOBAL_CHAIN, action="run.sealed", payload__chain=chain)
    assert (seal.payload["seq"], seal.payload["hash"]) == (pending.seq, pending.hash)
    assert verify().intact


@pytest.mark.parametrize("at_once", [True, False], ids=["one statement", "plain"])
def test_a_sibling_run_ending_while_the_end_waits_for_the_task_is_counted_in_its_totals(
    live_pool, monkeypatch, at_once
):
    """Two runs of one task end at once (a live run and a retry, a rollout's samples): the second end
    waits for the task's row while the first commits, having read the runs' totals before. It must
    not write the task's totals from that read: the sibling's cost (here added at its end, as a judge's
    is) is in the task's totals, which are the sum of its runs'. Both ways a run ends: in one
    statement, and plainly (whose task update waited for the row too)."""
    from routing.engine import executor

    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", [])))] * 2)
    server.program("alpha", [Reply("draft", prompt_tokens=100, completion_tokens=10)] * 2)
    run = submit()
    sibling = Run.objects.create(
        task_id=run.task_id,
        conductor_version=run.conductor_version,
        kind=Run.Kind.RETRY,
        status=RunStatus.RUNNING,
    )
    at_end, locked = threading.Event(), threading.Event()
    original = executor._compiled

    def compiled(execution, change, assumed):
        if change.ends is None:
            return original(execution, change, assumed)
        at_end.set()
        assert locked.wait(30)
        return original(execution, change, assumed) if at_once else None

    monkeypatch.setattr(executor, "_compiled", compiled)
    probe = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    thread, outcome = executed_in_thread(run)
    thread.start()
    try:
        assert at_end.wait(30), outcome
        with transaction.atomic(), connection.cursor() as cursor:  # the sibling's end
            cursor.execute("SELECT 1 FROM routing_task WHERE id = %s FOR UPDATE", [run.task_id])
            cursor.execute("SELECT pg_backend_pid()")
            holder = cursor.fetchone()[0]
            locked.set()
            # the end's own statement waits for the row this transaction holds: the one statement, or
            # a statement of the fenced end on the task's row
            waiting = "WITH run_as_assumed AS%" if at_once else "%routing_task%"
            assert waits_for_a_lock(probe, thread, waiting, holder), (
                "the run's end never waited for the task's row"
            )
            Run.objects.filter(pk=sibling.pk).update(
                status=RunStatus.SUCCEEDED, cost_usd=Decimal("0.2500000000"), input_tokens=40, output_tokens=4
            )
            cursor.execute(
                "UPDATE routing_task t SET cost_usd = (SELECT sum(cost_usd) FROM routing_run WHERE task_id = t.id) "
                "WHERE id = %s",
                [run.task_id],
            )
    finally:
        locked.set()
        thread.join(30)
        probe.close()
    assert outcome == [None], outcome
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    task = run.task
    task.refresh_from_db()
    runs = Run.objects.filter(task_id=task.pk).aggregate(
        c=Sum("cost_usd"), i=Sum("input_tokens"), o=Sum("output_tokens")
    )
    assert runs["c"] == run.cost_usd + Decimal("0.25")
    assert (task.cost_usd, task.input_tokens, task.output_tokens) == (runs["c"], runs["i"], runs["o"])
    # the ending run's chain and the global chain verify; the sibling, forged here outside the
    # engine, is all that verification finds wrong
    assert {p.chain for p in verify().problems} == {f"run:{sibling.correlation_id}"}
