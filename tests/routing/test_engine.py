"""The engine against a real OpenAI-protocol server on loopback and a real PostgreSQL."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

import pytest
from django.db.models import Sum

from audit.models import AuditEvent
from routing import engine
from routing.models import Attempt, Decision, Run, RunStatus, Step, StepStatus, Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


def submit(text: str = "What is 6 * 7?", **kwargs) -> Run:
    task, _ = task_submit(submission=TaskSubmission(text=text, **kwargs), source=Task.Source.API)
    return task.runs.get()


def run_now(run: Run) -> Run:
    engine.execute_run(run.pk)
    run.refresh_from_db()
    return run


def assert_rollups_exact(run: Run) -> None:
    steps = Step.objects.filter(run=run)
    for step in steps:
        attempts = step.attempts.aggregate(c=Sum("cost_usd"), i=Sum("input_tokens"), o=Sum("output_tokens"))
        if step.attempts.exists():
            assert step.cost_usd == attempts["c"]
            assert step.input_tokens == attempts["i"]
            assert step.output_tokens == attempts["o"]
    attempt_cost = Attempt.objects.filter(step__run=run).aggregate(c=Sum("cost_usd"))["c"] or Decimal(0)
    decision_cost = Decision.objects.filter(run=run).aggregate(c=Sum("cost_usd"))["c"] or Decimal(0)
    assert run.cost_usd == attempt_cost + decision_cost
    tokens_in = (Attempt.objects.filter(step__run=run).aggregate(t=Sum("input_tokens"))["t"] or 0) + (
        Decision.objects.filter(run=run).aggregate(t=Sum("input_tokens"))["t"] or 0
    )
    assert run.input_tokens == tokens_in
    task = Task.objects.get(pk=run.task_id)
    assert task.cost_usd == sum((r.cost_usd for r in task.runs.all()), Decimal(0))


def test_three_step_dag_runs_independent_steps_concurrently_and_shows_each_step_only_its_access(live_pool):
    server = live_pool["server"]
    server.program(
        "conductor",
        [
            Reply(
                plan_json(("alpha", "Solve A", []), ("beta", "Solve B", []), ("gamma", "Combine", "all")),
                prompt_tokens=300,
                completion_tokens=60,
            )
        ],
    )
    server.program(
        "alpha", [Reply("answer from alpha", delay_s=0.6, prompt_tokens=100, completion_tokens=20)]
    )
    server.program("beta", [Reply("answer from beta", delay_s=0.6, prompt_tokens=80, completion_tokens=10)])
    server.program("gamma", [Reply("42", prompt_tokens=200, completion_tokens=3)])

    run = run_now(submit(reference="42", scorer="numeric"))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.final_answer == "42"
    assert run.score == 1.0
    a, b = server.requests_for("alpha")[0], server.requests_for("beta")[0]
    assert a.started < b.finished and b.started < a.finished, "independent steps did not overlap"
    steps = {s.index: s for s in Step.objects.filter(run=run)}
    assert "answer from alpha" not in json.dumps(steps[1].messages_sent)
    combined = steps[2].messages_sent[-1]["content"]
    assert "answer from alpha" in combined and "answer from beta" in combined
    # What was persisted is exactly what the provider received.
    assert server.requests_for("gamma")[0].body["messages"] == steps[2].messages_sent
    # Cost is Decimal arithmetic on the worker's prices: 100 * 1.00/1M + 20 * 2.00/1M.
    assert steps[0].cost_usd == Decimal("0.000140")
    assert steps[0].vendor == "acme" and steps[2].vendor == "globex"
    assert_rollups_exact(run)
    actions = list(
        AuditEvent.objects.filter(correlation_id=run.correlation_id).values_list("action", flat=True)
    )
    assert actions[0] == "task.submitted" and actions[-1] == "run.succeeded"
    assert actions.count("step.succeeded") == 3


def test_a_run_keeps_to_its_step_concurrency_on_the_process_threads(live_pool, settings):
    """The step threads are the process's (started once); each run is held to CONDUCTOR_STEP_CONCURRENCY
    calls at once: at 1, two independent steps are called one after the other, in their order."""
    settings.CONDUCTOR_STEP_CONCURRENCY = 1
    server = live_pool["server"]
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Solve A", []), ("beta", "Solve B", []), ("gamma", "Combine", "all")))],
    )
    server.program("alpha", [Reply("answer from alpha", delay_s=0.3)])
    server.program("beta", [Reply("answer from beta", delay_s=0.3)])
    server.program("gamma", [Reply("42")])

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    a, b = server.requests_for("alpha")[0], server.requests_for("beta")[0]
    assert a.finished <= b.started, "the second call went out before the first came back"
    threads = {t.name for t in threading.enumerate() if t.name.startswith("steps")}
    assert threads, "the calls were not made on the process's step threads"

    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Solve A", []), ("beta", "Solve B", []), ("gamma", "Combine", "all")))],
    )
    for worker in ("alpha", "beta", "gamma"):
        server.program(worker, [Reply("again")])
    assert run_now(submit()).status == RunStatus.SUCCEEDED
    # The next run used the same threads: none was started for it.
    assert {t.name for t in threading.enumerate() if t.name.startswith("steps")} <= threads


def test_a_step_that_fans_out_starts_its_followers_side_by_side(live_pool):
    """Step 0 starts with the plan; its success makes two steps ready at once (each sees step 0), which
    the schedule starts itself and calls side by side."""
    server = live_pool["server"]
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check A", [0]), ("gamma", "Check B", [0])))],
    )
    server.program("alpha", [Reply("draft")])
    server.program("beta", [Reply("checked by beta", delay_s=0.3)])
    server.program("gamma", [Reply("checked by gamma", delay_s=0.3)])

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    b, c = server.requests_for("beta")[0], server.requests_for("gamma")[0]
    assert b.started < c.finished and c.started < b.finished, "the two followers did not overlap"
    assert "draft" in json.dumps(b.body["messages"]) and "draft" in json.dumps(c.body["messages"])
    assert [s.attempts.count() for s in Step.objects.filter(run=run).order_by("index")] == [1, 1, 1]


def test_conductor_request_carries_the_workflow_schema_and_logprobs_become_alternatives(live_pool):
    server = live_pool["server"]
    plan = plan_json(("beta", "Do it", []))
    # Tokens of the plan text; at the worker name the model weighed beta (0.7) against alpha (0.2).
    prefix, rest = plan.split('"worker": "', 1)
    logprobs = [
        {"token": prefix + '"worker": "', "logprob": 0.0, "top_logprobs": []},
        {
            "token": "beta",
            "logprob": -0.357,
            "top_logprobs": [{"token": "beta", "logprob": -0.357}, {"token": "al", "logprob": -1.609}],
        },
        {"token": rest[len("beta") :], "logprob": 0.0, "top_logprobs": []},
    ]
    server.program("conductor", [Reply(plan, logprobs=logprobs)])
    server.program("beta", [Reply("done")])

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    body = server.requests_for("conductor")[0].body
    schema = body["structured_outputs"]["json"]
    assert schema["properties"]["steps"]["items"]["properties"]["worker"]["enum"] == [
        "alpha",
        "beta",
        "conductor",
        "gamma",
    ]
    assert body["logprobs"] is True
    decision = Decision.objects.get(run=run)
    candidates = decision.alternatives[0]["candidates"]
    assert candidates[0] == {"token": "beta", "p": pytest.approx(0.7, abs=0.01), "workers": ["beta"]}
    assert candidates[1]["workers"] == ["alpha"]


def test_malformed_plan_is_recorded_and_retried_once_with_the_error_shown(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply("{not json"), Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("fine")])

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED
    first, second = Decision.objects.filter(run=run).order_by("attempt")
    assert not first.valid and "not valid JSON" in first.error and first.raw_output == "{not json"
    assert second.valid
    assert "not valid JSON" in server.requests_for("conductor")[1].user_text
    assert AuditEvent.objects.filter(action="plan.rejected", object_id=str(first.pk)).exists()


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (plan_json(("mallory", "Exfiltrate", [])), "names worker 'mallory'"),
        (plan_json(("alpha", "A", [1]), ("beta", "B", [])), "must be empty"),
        (plan_json(("alpha", "A", []), ("beta", "B", [1])), "may only see earlier steps"),
        (plan_json(*[("alpha", f"S{i}", []) for i in range(6)]), "at most 5"),
    ],
    ids=["unknown-worker", "first-step-access", "forward-access", "too-many-steps"],
)
def test_invalid_plan_twice_fails_the_run_with_a_clear_message_and_calls_no_worker(live_pool, plan, message):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan)])
    for slug in ("alpha", "beta"):
        server.program(slug, [Reply("should not be called")])

    run = run_now(submit())

    assert run.status == RunStatus.FAILED
    assert run.stop_reason == "invalid_plan"
    assert message in run.error and "invalid twice" in run.error
    assert Decision.objects.filter(run=run, valid=False).count() == 2
    assert not server.requests_for("alpha") and not server.requests_for("beta")
    assert Task.objects.get(pk=run.task_id).status == RunStatus.FAILED


def test_rate_limit_then_success_keeps_both_attempts_and_honours_retry_after(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program(
        "alpha",
        [
            Reply(status=429, headers={"Retry-After": "0.2"}),
            Reply("after the wait", prompt_tokens=50, completion_tokens=5),
        ],
    )

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED
    attempts = list(Attempt.objects.filter(step__run=run).order_by("number"))
    assert [a.status for a in attempts] == [Attempt.Status.RATE_LIMITED, Attempt.Status.SUCCEEDED]
    assert attempts[0].http_status == 429 and attempts[0].cost_usd == 0
    first, second = server.requests_for("alpha")
    assert second.started - first.finished >= 0.18, "Retry-After was not honoured"
    assert_rollups_exact(run)


def test_server_errors_exhaust_the_retries_and_fail_the_run(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply(status=500)])

    run = run_now(submit())

    assert run.status == RunStatus.FAILED and run.stop_reason == "step_failed"
    assert "failed after 3 attempt(s): server_error (HTTP 500)" in run.error
    assert (
        list(Attempt.objects.filter(step__run=run).values_list("status", flat=True))
        == [Attempt.Status.SERVER_ERROR] * 3
    )
    assert Step.objects.get(run=run).status == StepStatus.FAILED


def test_a_timeout_is_an_attempt_and_is_retried(live_pool, settings):
    settings.CONDUCTOR_PROVIDER_TIMEOUT_S = 0.5
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("too late", delay_s=2.0), Reply("in time")])

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.final_answer == "in time"
    statuses = list(Attempt.objects.filter(step__run=run).order_by("number").values_list("status", flat=True))
    assert statuses == [Attempt.Status.TIMEOUT, Attempt.Status.SUCCEEDED]


def test_a_client_error_is_not_retried(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply(status=400)])

    run = run_now(submit())

    assert run.status == RunStatus.FAILED
    assert len(server.requests_for("alpha")) == 1


def program_recursion(server) -> None:
    """The conductor plans alpha, then itself as step 1; called as that step, it plans gamma."""
    outer = plan_json(("alpha", "Draft", []), ("conductor", "Decide whether to check the draft", "all"))
    inner = plan_json(("gamma", "Check the draft", "all"))

    def conductor(body):
        text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        return Reply(inner if "You were called as a step" in text else outer)

    server.program("conductor", conductor)
    server.program("alpha", [Reply("draft answer")])
    server.program("gamma", [Reply("checked answer")])


def test_conductor_as_a_worker_recurses_and_the_nested_answer_is_final(live_pool):
    server = live_pool["server"]
    program_recursion(server)

    run = run_now(submit(max_depth=1))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.final_answer == "checked answer"
    nested = Decision.objects.get(run=run, depth=1)
    assert nested.parent_step.worker_slug == "conductor"
    inner_request = server.requests_for("conductor")[-1]
    assert "draft answer" in inner_request.user_text  # the inner call sees the last response
    # At depth 1 with max_depth 1 the conductor may not name itself again.
    assert (
        "conductor"
        not in inner_request.body["structured_outputs"]["json"]["properties"]["steps"]["items"]["properties"][
            "worker"
        ]["enum"]
    )
    assert_rollups_exact(run)


def test_an_empty_nested_plan_passes_the_last_response_through(live_pool):
    server = live_pool["server"]
    outer = plan_json(("alpha", "Draft", []), ("conductor", "Check", "all"))

    def conductor(body):
        text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        return Reply(
            json.dumps({"thought": "fine as is", "steps": []}) if "You were called" in text else outer
        )

    server.program("conductor", conductor)
    server.program("alpha", [Reply("draft answer")])

    run = run_now(submit(max_depth=2))

    assert run.final_answer == "draft answer"
    assert "passed the last response through" in Step.objects.get(run=run, worker_slug="conductor").note


def test_depth_cap_zero_forbids_recursion(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("conductor", "Recurse", [])))])

    run = run_now(submit(max_depth=0))

    assert run.status == RunStatus.FAILED
    assert "names worker 'conductor'" in run.error


def test_step_budget_limits_the_plan_length(live_pool):
    server = live_pool["server"]
    server.program(
        "conductor", [Reply(plan_json(("alpha", "A", []), ("beta", "B", []), ("gamma", "C", "all")))]
    )

    run = run_now(submit(max_steps=2))

    assert run.status == RunStatus.FAILED
    assert "at most 2 are allowed" in run.error


def test_cost_budget_stops_the_run_before_the_next_call(live_pool):
    server = live_pool["server"]
    server.program(
        "conductor",
        [
            Reply(
                plan_json(("gamma", "Expensive", []), ("alpha", "Next", "all")),
                prompt_tokens=0,
                completion_tokens=0,
            )
        ],
    )
    server.program("gamma", [Reply("pricey", prompt_tokens=1000, completion_tokens=1000)])  # $0.018
    server.program("alpha", [Reply("never")])

    run = run_now(submit(max_usd=Decimal("0.01")))

    assert run.status == RunStatus.FAILED and run.stop_reason == "cost_budget"
    assert "cost budget of $0.0100000000 reached" in run.error
    assert not server.requests_for("alpha")
    assert_rollups_exact(run)


def test_confidential_task_sees_only_workers_cleared_for_it(live_pool):
    from routing.models import Worker

    Worker.objects.filter(slug="gamma").update(data_classes=["public", "internal", "confidential"])
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Leak it", [])))])

    run = run_now(submit(classification="confidential"))

    assert run.status == RunStatus.FAILED and run.stop_reason == "policy_blocked"
    assert "blocked by policy 'worker-clearance': step 0 (alpha)" in run.error
    assert not server.requests_for("alpha")
    enum = server.requests_for("conductor")[0].body["structured_outputs"]["json"]["properties"]["steps"][
        "items"
    ]["properties"]["worker"]["enum"]
    assert enum == ["conductor", "gamma"]


def test_replay_pool_three_step_workflow_scores_against_the_reference(replay_pool, transactional_db):
    from routing import replay

    item = next(i for i in replay.read_items(replay.split_path("dev")) if i.domain == "math-l5")
    task, _ = task_submit(
        submission=TaskSubmission(
            text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
        ),
        source=Task.Source.CLI,
    )
    run = run_now(task.runs.get())

    assert run.status == RunStatus.SUCCEEDED, run.error
    steps = list(Step.objects.filter(run=run).order_by("index"))
    assert [s.worker_slug for s in steps] == [
        "gpt-4o-mini-2024-07-18",
        "gemini-1.5-flash",
        "gpt-4o-2024-08-06",
    ]
    recorded = item.outcomes["gpt-4o-mini-2024-07-18"]
    assert steps[0].output_tokens == recorded["completion_tokens"]
    assert steps[0].cost_usd.quantize(Decimal("1e-8")) == Decimal(str(recorded["cost_usd"])).quantize(
        Decimal("1e-8")
    )
    expected = item.outcomes["gpt-4o-2024-08-06"]["score"]
    assert run.score == expected
    assert_rollups_exact(run)


def test_a_second_process_cannot_execute_a_run_that_is_locked(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "A", [])))])
    server.program("alpha", [Reply("x")])
    run = submit()
    with engine.run_lock(run.pk) as held:
        assert held
        engine.execute_run(run.pk)  # another "process" finds the lock taken and leaves the run alone
        run.refresh_from_db()
        assert run.status == RunStatus.QUEUED and run.deliveries == 0
    assert run_now(run).status == RunStatus.SUCCEEDED


def test_the_conductor_endpoint_failing_once_is_retried_and_audited(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(status=503), Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("done")])

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    failed = AuditEvent.objects.get(correlation_id=run.correlation_id, action="conductor.call_failed")
    assert failed.payload["http_status"] == 503 and failed.payload["status"] == "server_error"


def test_the_conductor_endpoint_down_fails_the_run_with_a_clear_message(live_pool):
    live_pool["server"].program("conductor", [Reply(status=500)])

    run = run_now(submit())

    assert run.status == RunStatus.FAILED and run.stop_reason == "conductor_unavailable"
    assert "the conductor could not be reached after 3 attempt(s)" in run.error
    assert not Decision.objects.filter(run=run).exists()
