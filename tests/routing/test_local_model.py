"""The local model in the loop: llama.cpp's real server with SmolLM2-135M-Instruct (never a fake), as a
worker that answers free text and as an `llm` conductor that writes the workflow the engine runs; and
what happens when it refuses, writes nonsense, is too slow, or dies mid-call.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from decimal import Decimal

import pytest

from audit.models import AuditEvent
from audit.services import Actor
from audit.verify import verify
from conductor_web import local_model as server
from operations.overview import figures
from routing import replay
from routing.conductors.llm import OPENAI
from routing.local_pool import VENDOR, WORKER_SLUG, conductor_config, worker_fields
from routing.models import Attempt, ConductorVersion, Decision, Run, RunStatus, Step, StopReason, Task
from routing.services import conductor_activate, task_retry, worker_upsert
from tests.conftest import wait_for
from tests.routing.test_engine import run_now, submit

pytestmark = pytest.mark.django_db(transaction=True)

FRANCE = "What is the capital of France?"


def assert_no_vendor_errors() -> None:
    """The live overview counts no failed call against any worker, and raises no alert."""
    data = figures.overview(minutes=60)
    assert [(w["worker"], w["errors"]) for w in data["workers"] if w["errors"]] == []
    assert data["alerts"] == []


def activate(name: str, backend: str, config: dict) -> ConductorVersion:
    version, _ = ConductorVersion.objects.get_or_create(
        name=name, defaults={"backend": backend, "config": config}
    )
    return conductor_activate(version=version, actor=Actor.service("tests"))


def test_free_text_is_answered_by_the_local_model_and_no_vendor_errs(replay_pool, local_pool):
    """The demo's first question: the replay pool is not offered what it never recorded; the static
    rules' fallback, the cheapest worker that can answer, is the local model."""
    run = run_now(submit(FRANCE))

    assert run.status == RunStatus.SUCCEEDED, run.error
    (step,) = Step.objects.filter(run=run)
    assert (step.worker_slug, step.vendor) == (WORKER_SLUG, VENDOR)
    assert step.instruction == FRANCE
    (attempt,) = step.attempts.all()
    assert attempt.status == Attempt.Status.SUCCEEDED
    assert attempt.input_tokens > 0 and attempt.output_tokens > 0  # counted by the real server
    assert attempt.cost_usd == Decimal(0)
    task = Task.objects.get(pk=run.task_id)
    assert task.final_answer.strip() and task.final_answer == step.response
    decision = Decision.objects.get(run=run)
    # Offered: the local model alone (no replay worker recorded this text).
    assert [w for w in decision.policy_checks["withheld"]] == []
    assert decision.plan["steps"][0]["worker"] == WORKER_SLUG
    assert_no_vendor_errors()
    assert verify(chains=[f"run:{run.correlation_id}"]).intact


def test_the_learned_conductor_gives_free_text_to_the_local_model(replay_pool, local_pool, tmp_path):
    """The demo's default conductor knows only workflows of the replay pool: none fits free text, so it
    plans the cheapest worker that can answer."""
    from training.policy import Policy, Workflow

    path = tmp_path / "policy.json"
    path.write_text(Policy.new([Workflow("single", ("gpt-4o-mini-2024-07-18",))]).to_json())
    activate("learned-test", "learned", {"policy_path": str(path)})

    run = run_now(submit(FRANCE))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert list(Step.objects.filter(run=run).values_list("worker_slug", flat=True)) == [WORKER_SLUG]
    # None of the policy's workflows was open to it: none is shown as weighed.
    assert Decision.objects.get(run=run).alternatives == []
    assert_no_vendor_errors()


def test_free_text_before_the_local_model_is_up_fails_clearly_then_a_retry_answers(
    replay_pool, local_model_server, make_user
):
    first = run_now(submit(FRANCE))

    assert first.status == RunStatus.FAILED
    assert first.stop_reason == StopReason.NO_RECORDED_ANSWER
    assert "replay pool answers only the benchmark items it recorded" in first.error
    assert not Attempt.objects.filter(step__run=first).exists()  # no vendor was asked anything
    assert_no_vendor_errors()

    from routing.local_pool import local_model_register

    local_model_register(api_base=local_model_server, actor=Actor.service("tests"))
    retry = task_retry(task_id=first.task_id, user=make_user("olga", "operator"))
    retry = run_now(retry)

    assert (retry.kind, retry.status) == (Run.Kind.RETRY, RunStatus.SUCCEEDED)
    task = Task.objects.get(pk=first.task_id)
    assert task.status == RunStatus.SUCCEEDED and task.final_answer and task.error == ""
    first.refresh_from_db()
    assert first.status == RunStatus.FAILED  # its record stays as it was
    retried = AuditEvent.objects.get(action="task.retried", task_id=task.pk)
    assert retried.payload["run_id"] == retry.pk and retried.correlation_id == retry.correlation_id
    assert retried.actor_name == "olga"


def test_the_local_conductor_writes_a_workflow_the_engine_runs(replay_pool, local_pool):
    """SmolLM2 writes the workflow under llama.cpp's JSON-schema constraint; its alternatives come from
    the token log-probabilities where each worker's name begins."""
    conductor_activate(version=local_pool["conductor"], actor=Actor.service("tests"))
    item = replay.sample_items()[0]

    run = run_now(submit(item.task, reference=item.reference, domain=item.domain, source_item=item.id))

    decisions = list(Decision.objects.filter(run=run, depth=0).order_by("attempt"))
    assert decisions[-1].valid, [d.error for d in decisions]
    assert run.status == RunStatus.SUCCEEDED, run.error
    plan = decisions[-1].plan
    pool = set(replay.load_models()) | {WORKER_SLUG, "conductor"}
    assert {s["worker"] for s in plan["steps"]} <= {p.lower() for p in pool}
    assert decisions[-1].input_tokens > 0 and decisions[-1].output_tokens > 0
    alternatives = decisions[-1].alternatives
    assert len(alternatives) == len(plan["steps"])
    for weighed, step in zip(alternatives, plan["steps"], strict=True):
        probabilities = [c["p"] for c in weighed["candidates"]]
        assert 0 < sum(probabilities) <= 1.0001 and probabilities == sorted(probabilities, reverse=True)
        # The name it wrote begins with a token it weighed.
        assert any(step["worker"] in c["workers"] for c in weighed["candidates"])


def test_a_schema_the_server_refuses_is_recorded_once_with_its_reason(replay_pool, local_pool):
    """llama.cpp's server answers OpenAI's json_schema form with a 500 that says the request did not
    validate: a refusal, recorded once and not retried as an outage."""
    activate(
        "smollm2-openai-form", "llm", {**conductor_config(local_pool["api_base"]), "schema_dialect": OPENAI}
    )

    run = run_now(submit(FRANCE))

    assert (run.status, run.stop_reason) == (RunStatus.FAILED, StopReason.CONDUCTOR_UNAVAILABLE)
    assert "after 1 attempt(s)" in run.error and "refused" in run.error
    (failed,) = AuditEvent.objects.filter(correlation_id=run.correlation_id, action="conductor.call_failed")
    assert (failed.payload["status"], failed.payload["http_status"]) == (Attempt.Status.CLIENT_ERROR, 500)
    assert "json_object" in failed.payload["error"]  # the server's own reason


def test_malformed_conductor_output_is_recorded_and_retried_once(replay_pool, local_pool):
    """Cut off after a few tokens, the model's workflow is not JSON: each answer is recorded as
    rejected, with the parser's reason, and the run fails as an invalid plan."""
    activate("smollm2-cut-short", "llm", {**conductor_config(local_pool["api_base"]), "max_tokens": 4})

    run = run_now(submit(FRANCE))

    assert (run.status, run.stop_reason) == (RunStatus.FAILED, StopReason.INVALID_PLAN)
    decisions = list(Decision.objects.filter(run=run).order_by("attempt"))
    assert [d.valid for d in decisions] == [False, False]
    assert all(d.raw_output and d.error for d in decisions)
    assert "invalid twice" in run.error


def test_a_model_slower_than_the_timeout_is_a_recorded_timeout(replay_pool, local_pool, settings):
    settings.CONDUCTOR_PROVIDER_TIMEOUT_S = 0.05

    run = run_now(submit(FRANCE))

    assert (run.status, run.stop_reason) == (RunStatus.FAILED, StopReason.STEP_FAILED)
    attempts = list(Attempt.objects.filter(step__run=run).order_by("number"))
    assert len(attempts) == settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS
    assert {a.status for a in attempts} == {Attempt.Status.TIMEOUT}
    assert all("Timeout" in a.error or "timed out" in a.error for a in attempts)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_killed_mid_call_fails_the_step_with_a_clear_reason(replay_pool, local_pool, tmp_path):
    """A second server of the same model, killed while it answers: the call in flight and the ones that
    follow are recorded (each a server error, nothing taken for an answer), and the run fails."""
    weights = server.weights_file()
    assert weights is not None
    port = _free_port()
    config = tmp_path / "server.json"
    config.write_text(json.dumps(server.server_config(weights, port)))
    proc = subprocess.Popen(
        server.server_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        api_base = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: server.healthy(api_base), timeout=120, interval=0.25, what="the second server")
        local_pool["worker"].enabled = False
        local_pool["worker"].save(update_fields=["enabled"])
        worker_upsert(slug="smollm2-doomed", fields=worker_fields(api_base), actor=Actor.service("tests"))
        # A long answer: the call is still in flight when the server dies.
        run = submit("Write a long story about a lighthouse keeper, in at least twenty paragraphs.")
        ran = threading.Thread(target=run_now, args=(run,))
        ran.start()
        wait_for(
            lambda: Attempt.objects.filter(step__run=run, status=Attempt.Status.STARTED).exists(),
            timeout=60,
            what="the call in flight",
        )
        time.sleep(0.3)
        proc.kill()
        ran.join(120)
        assert not ran.is_alive()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == (RunStatus.FAILED, StopReason.STEP_FAILED)
    attempts = list(Attempt.objects.filter(step__run=run).order_by("number"))
    assert attempts and {a.status for a in attempts} == {Attempt.Status.SERVER_ERROR}
    assert all(a.error and not a.output_tokens for a in attempts)
    (step,) = Step.objects.filter(run=run)
    assert step.status == "failed" and step.response == ""
