"""A finished run leaves no step pending or running, nested levels included (real engine, real PostgreSQL).

Steps that never ran because the run stopped are skipped with the reason; a step an unexpected error
interrupted is failed. Each settlement is an engine event on the run's chain, before the chain is sealed.
Free text that no worker can answer (the replay pool recorded none of it) is a clear, intended failure
before any call: its own message, no vendor asked, no litellm exception text.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from django.test import Client

from accounts.models import Role
from audit.models import AuditEvent
from audit.verify import verify
from routing import engine
from routing.conductors import Proposal, backend_register
from routing.engine.planning import NO_WORKER_ANSWERS
from routing.models import Attempt, ConductorVersion, Run, RunStatus, Step, StepStatus, Task
from routing.providers import NO_RECORDED_ANSWER, NO_RECORDED_ANSWER_MESSAGE, ProviderCallError, complete
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import run_now, submit
from training.policy import Policy, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

CHEAP_A, CHEAP_B, JUDGE = "gpt-4o-mini-2024-07-18", "gemini-1.5-flash", "gpt-4o-2024-08-06"
UNSETTLED = (StepStatus.PENDING, StepStatus.RUNNING)
# What a failure message must not carry: a stack trace, or litellm's exception wrapping.
NOISE = ("Traceback", 'File "', "litellm", "Exception", "NotFoundError")


def learned_cascade(path: Path, workers: tuple[str, str, str]) -> ConductorVersion:
    """The learned conductor (the demo's default) with one action: a cascade of these workers."""
    path.write_text(Policy.new([Workflow("cascade", workers)]).to_json())
    version = ConductorVersion.objects.create(
        name="learned-cascade", backend="learned", config={"policy_path": str(path)}
    )
    ConductorVersion.objects.exclude(pk=version.pk).update(is_active=False)
    ConductorVersion.objects.filter(pk=version.pk).update(is_active=True)
    return version


def assert_settled(run: Run) -> dict[tuple[int, int, str], Step]:
    """No step of the run is left pending or running; each ended step has its finish time."""
    steps = list(Step.objects.filter(run=run).order_by("depth", "decision_id", "index"))
    left = [(s.depth, s.index, s.worker_slug, s.status) for s in steps if s.status in UNSETTLED]
    assert not left, f"steps left unsettled by a finished run: {left}"
    assert all(s.finished_at is not None for s in steps)
    assert verify(chains=[f"run:{run.correlation_id}"]).intact
    return {(s.depth, s.index, s.worker_slug): s for s in steps}


def settlement_events(run: Run) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(correlation_id=run.correlation_id, payload__settled_with_run=True).order_by(
            "seq"
        )
    )


def test_free_text_on_the_replay_pool_alone_fails_clearly_before_any_call(replay_pool, tmp_path):
    """The demo's first question before any live worker is registered: no worker of the replay pool
    recorded an answer to it, so none is offered it; the run stops before its plan, and no vendor is
    asked anything (none is counted as failing)."""
    learned_cascade(tmp_path / "policy.json", (CHEAP_A, CHEAP_B, JUDGE))

    run = run_now(submit("What is 17 * 24?"))

    assert run.status == RunStatus.FAILED
    assert run.stop_reason == NO_RECORDED_ANSWER
    assert run.error == NO_WORKER_ANSWERS
    task = Task.objects.get(pk=run.task_id)
    assert task.status == RunStatus.FAILED and task.error == NO_WORKER_ANSWERS
    assert not Step.objects.filter(run=run).exists()
    assert not Attempt.objects.filter(step__run=run).exists()
    assert not any(noise in run.error for noise in NOISE), run.error
    assert verify(chains=[f"run:{run.correlation_id}"]).intact
    failed = AuditEvent.objects.get(correlation_id=run.correlation_id, action="run.failed")
    assert failed.payload["stop_reason"] == NO_RECORDED_ANSWER


def test_a_replay_miss_is_not_a_vendors_error(replay_pool):
    """Asked what it never recorded, the replay pool answers with its own status, outside the errors
    that the overview counts against a vendor, and it is never retried."""
    with pytest.raises(ProviderCallError) as raised:
        complete(model=f"replay/{CHEAP_A}", messages=[{"role": "user", "content": "What is 17 * 24?"}])

    assert raised.value.status == Attempt.Status.NO_RECORDING
    assert raised.value.status not in Attempt.ERRORS
    assert not raised.value.retryable
    assert str(raised.value) == NO_RECORDED_ANSWER_MESSAGE


def test_the_task_page_shows_why_free_text_found_no_worker(replay_pool, tmp_path, make_user):
    learned_cascade(tmp_path / "policy.json", (CHEAP_A, CHEAP_B, JUDGE))
    run = run_now(submit("What is 17 * 24?"))
    client = Client()
    client.force_login(make_user("grace", Role.OPERATOR))

    html = client.get(f"/tasks/{run.task_id}/").content.decode()

    assert "no worker can answer this task" in html
    assert "Retry" in html  # an operator may run it again once a live worker is up
    assert not any(noise in html for noise in ("Traceback", "ReplayException", "litellm.NotFoundError"))


def test_server_errors_in_a_nested_plan_settle_every_level(live_pool):
    """A nested step answers 500 every time: its sibling, its parent's later step, all end settled."""
    server = live_pool["server"]
    outer = plan_json(
        ("alpha", "Draft", []), ("conductor", "Check the draft", "all"), ("gamma", "Final", "all")
    )
    inner = plan_json(("beta", "Check", "all"), ("gamma", "Summarise the check", "all"))

    def conductor(body):
        text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        return Reply(inner if "You were called as a step" in text else outer)

    server.program("conductor", conductor)
    server.program("alpha", [Reply("draft")])
    server.program("beta", [Reply(status=500)])
    server.program("gamma", [Reply("never called")])

    run = run_now(submit("Check a draft", max_depth=1))

    assert run.status == RunStatus.FAILED and run.stop_reason == "step_failed"
    assert "failed after 3 attempt(s): server_error (HTTP 500)" in run.error
    steps = assert_settled(run)
    assert steps[(0, 0, "alpha")].status == StepStatus.SUCCEEDED
    assert steps[(0, 1, "conductor")].status == StepStatus.FAILED
    assert steps[(1, 0, "beta")].status == StepStatus.FAILED
    assert steps[(1, 1, "gamma")].status == StepStatus.SKIPPED
    assert steps[(0, 2, "gamma")].status == StepStatus.SKIPPED
    for key in ((1, 1, "gamma"), (0, 2, "gamma")):
        assert steps[key].note.startswith("not run: the run stopped (step_failed): step 0 (beta) failed")
    assert not server.requests_for("gamma")
    events = settlement_events(run)
    assert [(e.action, e.object_id) for e in events] == [
        ("step.skipped", str(steps[(0, 2, "gamma")].pk)),
        ("step.skipped", str(steps[(1, 1, "gamma")].pk)),
    ]


def test_a_cost_budget_stop_skips_the_steps_after_it(live_pool):
    server = live_pool["server"]
    server.program(
        "conductor",
        [
            Reply(
                plan_json(("gamma", "Expensive", []), ("alpha", "Next", "all"), ("beta", "Last", "all")),
                prompt_tokens=0,
                completion_tokens=0,
            )
        ],
    )
    server.program("gamma", [Reply("pricey", prompt_tokens=1000, completion_tokens=1000)])  # $0.018

    run = run_now(submit("Spend it", max_usd=Decimal("0.01")))

    assert run.status == RunStatus.FAILED and run.stop_reason == "cost_budget"
    steps = assert_settled(run)
    assert steps[(0, 1, "alpha")].status == StepStatus.FAILED  # the step the budget stopped
    assert steps[(0, 2, "beta")].status == StepStatus.SKIPPED
    assert "cost budget" in steps[(0, 2, "beta")].note


class BreaksWhenNested:
    """A conductor backend with a bug that shows only when a conductor step asks it for a nested plan."""

    def __init__(self, config):
        pass

    def propose(self, request):
        if request.is_inner:
            raise FileNotFoundError("policy.json")
        return Proposal(
            raw_output=plan_json(
                ("alpha", "Draft", []), ("beta", "Check", [0]), ("conductor", "Decide", "all")
            )
        )


def test_a_step_interrupted_by_an_unexpected_error_ends_failed(live_pool):
    """The conductor step, already started, cannot plan (the backend raises a bug). The run fails as
    an internal error and the step does not stay "running"."""
    backend_register("breaks-when-nested", BreaksWhenNested)
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.create(name="breaks-when-nested", backend="breaks-when-nested", is_active=True)
    server = live_pool["server"]
    server.program("alpha", [Reply("18")])
    server.program("beta", [Reply("18")])
    run = submit("What is 3 * 6?")

    with pytest.raises(FileNotFoundError):
        engine.execute_run(run.pk)

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.stop_reason == "internal"
    steps = assert_settled(run)
    conductor_step = steps[(0, 2, "conductor")]
    assert conductor_step.status == StepStatus.FAILED
    assert conductor_step.error.startswith("interrupted: the run stopped (internal): internal error")
    (event,) = settlement_events(run)
    assert event.action == "step.failed" and event.payload["error"] == conductor_step.error


def test_a_succeeded_run_has_every_step_succeeded(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "A", []), ("beta", "B", "all")))])
    server.program("alpha", [Reply("a")])
    server.program("beta", [Reply("b")])

    run = run_now(submit("Two steps"))

    assert run.status == RunStatus.SUCCEEDED, run.error
    steps = assert_settled(run)
    assert {s.status for s in steps.values()} == {StepStatus.SUCCEEDED}
    assert not settlement_events(run)
    assert run.final_answer == "b"
