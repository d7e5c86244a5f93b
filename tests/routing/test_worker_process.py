"""Runs executed by real `celery worker` processes over the real broker, including one killed mid-run."""

from __future__ import annotations

import os
import signal

import pytest

from audit.models import AuditEvent
from routing.models import Attempt, Run, RunStatus, Step, StepStatus, Task
from routing.services import TaskSubmission, task_submit
from tests.conftest import wait_for
from tests.openai_server import Reply, plan_json

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_submitted_replay_task_is_run_by_a_worker_process(replay_pool, celery_workers):
    from routing import replay

    item = next(i for i in replay.read_items(replay.split_path("dev")) if i.domain == "gsm8k")
    celery_workers("w1")
    task, _ = task_submit(
        submission=TaskSubmission(
            text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
        ),
        source=Task.Source.API,
    )

    run = wait_for(
        lambda: Run.objects.filter(task=task, status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]).first(),
        timeout=60,
        what="the worker to finish the run",
    )

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.worker_pid and run.worker_pid != os.getpid()
    task.refresh_from_db()
    assert task.status == RunStatus.SUCCEEDED
    assert task.score == item.outcomes["gpt-4o-mini-2024-07-18"]["score"]
    assert task.cost_usd == run.cost_usd > 0


def test_a_run_whose_worker_process_is_killed_resumes_elsewhere_without_repeating_a_paid_call(
    live_pool, celery_workers
):
    server = live_pool["server"]
    server.program(
        "conductor",
        [
            Reply(
                plan_json(
                    ("alpha", "Step one", []), ("beta", "Step two", "all"), ("gamma", "Step three", "all")
                )
            )
        ],
    )
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, [Reply(f"{slug} says hi", delay_s=1.5, prompt_tokens=100, completion_tokens=10)])
    celery_workers("w1")
    celery_workers("w2")

    task, _ = task_submit(submission=TaskSubmission(text="Three steps, please"), source=Task.Source.API)
    run = task.runs.get()

    def second_step_in_flight():
        return (
            Step.objects.filter(run=run, index=0, status=StepStatus.SUCCEEDED).exists()
            and Attempt.objects.filter(step__run=run, step__index=1, status=Attempt.Status.STARTED).exists()
            and len(server.requests_for("beta")) == 1
        )

    wait_for(second_step_in_flight, timeout=60, what="step 1 to be in flight")
    run.refresh_from_db()
    killed_pid = run.worker_pid
    os.kill(killed_pid, signal.SIGKILL)

    wait_for(
        lambda: Run.objects.filter(pk=run.pk, status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]).exists(),
        timeout=90,
        what="the run to finish after the kill",
    )
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.final_answer == "gamma says hi"
    assert run.deliveries == 2
    assert run.worker_pid != killed_pid
    # Step 0 was paid for once and never called again; step 1's lost call was made again; step 2 once.
    assert len(server.requests_for("alpha")) == 1
    assert len(server.requests_for("beta")) == 2
    assert len(server.requests_for("gamma")) == 1
    for step in Step.objects.filter(run=run):
        assert step.status == StepStatus.SUCCEEDED
        assert step.attempts.filter(status=Attempt.Status.SUCCEEDED).count() == 1
    lost = Attempt.objects.get(step__run=run, status=Attempt.Status.LOST)
    # The lost call was paid for: an estimate, marked as such, counted in the run's cost.
    assert lost.step.index == 1 and lost.cost_estimated and lost.cost_usd > 0
    assert Step.objects.filter(run=run).count() == 3  # no step lost, none duplicated
    resumed = AuditEvent.objects.get(correlation_id=run.correlation_id, action="run.resumed")
    assert [(a["step_id"], a["attempt"], a["estimated"]) for a in resumed.payload["lost_attempts"]] == [
        (lost.step_id, lost.number, True)
    ]
