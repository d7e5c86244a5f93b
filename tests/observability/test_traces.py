"""Runs as OpenTelemetry traces: exported over OTLP/HTTP to a real Arize Phoenix (its own venv,
`make phoenix`) and read back through Phoenix's client; content only where the receiver is cleared;
export that fails never touches a run; JSON log lines that carry the run's trace id."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from django.core.management import CommandError, call_command
from phoenix.client import Client

from audit.models import PolicyRule
from audit.policies import CLEARANCE_RULE
from observability import telemetry, trace_spans
from routing import engine
from routing.models import Attempt, Decision, Run, RunStatus, Step, Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json
from utilities.structured_logs import ContextFilter, JsonLines

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
PHOENIX = ROOT / ".venv-phoenix" / "bin" / "phoenix"
PROJECT = "conductor-web"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    """`phoenix serve` on loopback, with a working directory of its own."""
    assert PHOENIX.exists(), "Phoenix is not installed: run `make phoenix` (make test does)"
    port, grpc = free_port(), free_port()
    home = tmp_path_factory.mktemp("phoenix")
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(home),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    with (home / "phoenix.log").open("wb") as out:
        process = subprocess.Popen([str(PHOENIX), "serve"], env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, (home / "phoenix.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Phoenix did not start"
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def exporting(settings, monkeypatch):
    """Export on, to the endpoint given; a fresh exporter each time (it reads the endpoint once)."""

    def to(endpoint: str, *, content_classes: tuple[str, ...] = ()) -> None:
        telemetry.shutdown()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        settings.OTEL_TRACES = True
        settings.OTEL_CONTENT_CLASSES = list(content_classes)

    yield to
    telemetry.shutdown()


def program_nested_run(server) -> None:
    """A plan of three steps (alpha answers a 429 first; beta sees alpha; the third is the conductor
    again, which plans one nested step on gamma)."""
    outer = plan_json(
        ("alpha", "Draft an answer", []),
        ("beta", "Check the draft", [0]),
        ("conductor", "Decide whether the check holds", "all"),
    )
    inner = plan_json(("gamma", "Write the final answer", "all"))

    def conductor(body):
        text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        return Reply(inner if "You were called as a step" in text else outer, prompt_tokens=40)

    server.program("conductor", conductor)
    server.program(
        "alpha",
        [
            Reply(status=429, headers={"Retry-After": "0"}),
            Reply("draft: 42", prompt_tokens=120, completion_tokens=9),
        ],
    )
    server.program("beta", [Reply("the draft holds", prompt_tokens=200, completion_tokens=4)])
    server.program("gamma", [Reply("Final: 42", prompt_tokens=300, completion_tokens=3)])


def run_nested(server, text: str = "What is 6 * 7?") -> Run:
    program_nested_run(server)
    task, _ = task_submit(submission=TaskSubmission(text=text, max_depth=1), source=Task.Source.API)
    run = task.runs.get()
    engine.execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def read_back(base: str, run: Run, expected: int) -> list:
    client = Client(base_url=base)
    deadline = time.monotonic() + 30
    while True:
        try:
            spans = client.spans.get_spans(
                project_identifier=PROJECT, trace_ids=[run.correlation_id.hex], limit=1000
            )
        except httpx.HTTPStatusError as exc:  # the project appears with its first span
            assert exc.response.status_code == 404, exc
            spans = []
        if len(spans) >= expected or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def span_id(kind: str, pk: int, run: Run) -> str:
    return f"{trace_spans.span_id(run.correlation_id.int, kind, pk):016x}"


def test_a_nested_run_reads_back_from_phoenix_as_the_record_has_it(live_pool, phoenix, exporting):
    exporting(phoenix, content_classes=("internal",))
    run = run_nested(live_pool["server"])
    assert telemetry.flush()

    decisions = list(Decision.objects.filter(run=run))
    steps = {s.pk: s for s in Step.objects.filter(run=run)}
    attempts = list(Attempt.objects.filter(step__run=run))
    assert len(decisions) == 2 and len(steps) == 4 and len(attempts) == 4  # alpha's 429 is an attempt
    expected = 1 + len(decisions) + len(steps) + len(attempts)
    spans = read_back(phoenix, run, expected)
    assert len(spans) == expected, [s["name"] for s in spans]
    by_id = {s["context"]["span_id"]: s for s in spans}
    assert {s["context"]["trace_id"] for s in spans} == {run.correlation_id.hex}

    # The run is the root; the plans and steps of depth 0 sit under it; the nested plan and its step
    # sit under the conductor step; each call sits under its step.
    root = by_id[span_id("run", run.pk, run)]
    assert root["parent_id"] is None
    assert root["status_code"] == "OK"
    attrs = root["attributes"]
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert Decimal(attrs["conductor_web.cost_usd"]) == run.cost_usd
    assert attrs["conductor_web.input_tokens"] == run.input_tokens
    assert attrs["conductor_web.output_tokens"] == run.output_tokens
    # Usage is on the calls only: a receiver that adds it up over the trace counts each token once.
    assert "gen_ai.usage.input_tokens" not in attrs and "llm.token_count.total" not in attrs
    conductor_step = next(s for s in steps.values() if s.worker_slug == "conductor")
    for d in decisions:
        span = by_id[span_id("decision", d.pk, run)]
        parent = span_id("run", run.pk, run) if d.depth == 0 else span_id("step", conductor_step.pk, run)
        assert span["parent_id"] == parent
        assert span["attributes"]["gen_ai.request.model"] == "hosted_vllm/conductor"
        assert span["attributes"]["gen_ai.usage.input_tokens"] == d.input_tokens
        assert Decimal(span["attributes"]["conductor_web.cost_usd"]) == d.cost_usd
    for step in steps.values():
        span = by_id[span_id("step", step.pk, run)]
        parent = span_id("run", run.pk, run) if step.depth == 0 else span_id("step", conductor_step.pk, run)
        assert span["parent_id"] == parent, step.worker_slug
        assert span["attributes"]["conductor_web.step.worker"] == step.worker_slug
        assert Decimal(span["attributes"]["conductor_web.cost_usd"]) == step.cost_usd
        assert span["attributes"]["conductor_web.output_tokens"] == step.output_tokens
        assert "gen_ai.usage.output_tokens" not in span["attributes"]
        if step.worker_id:
            assert span["attributes"]["gen_ai.provider.name"] == step.vendor
    for attempt in attempts:
        span = by_id[span_id("attempt", attempt.pk, run)]
        assert span["parent_id"] == span_id("step", attempt.step_id, run)
        assert span["name"] == f"chat openai/{steps[attempt.step_id].worker_slug}"
        assert span["attributes"]["gen_ai.operation.name"] == "chat"
        assert span["attributes"]["gen_ai.usage.input_tokens"] == attempt.input_tokens
        assert Decimal(span["attributes"]["conductor_web.cost_usd"]) == attempt.cost_usd
        if attempt.status == Attempt.Status.RATE_LIMITED:
            assert span["attributes"]["error.type"] == "rate_limited"
            assert span["status_code"] == "ERROR"
    # The figures add up as in the database: every call's and plan's tokens and cost.
    calls = [by_id[span_id("attempt", a.pk, run)] for a in attempts] + [
        by_id[span_id("decision", d.pk, run)] for d in decisions
    ]
    assert sum(s["attributes"]["gen_ai.usage.input_tokens"] for s in calls) == run.input_tokens
    assert sum(Decimal(s["attributes"]["conductor_web.cost_usd"]) for s in calls) == run.cost_usd

    # The nested step saw everything of its plan; beta saw alpha: links to the steps' spans.
    beta = next(s for s in steps.values() if s.worker_slug == "beta")
    alpha = next(s for s in steps.values() if s.worker_slug == "alpha")
    beta_span = by_id[span_id("step", beta.pk, run)]
    assert beta_span["attributes"]["conductor_web.step.sees"] == [0]
    links = trace_spans.run_spans(run.pk)
    sent = next(
        s for s in links if s.context.span_id == trace_spans.span_id(run.correlation_id.int, "step", beta.pk)
    )
    assert [link.context.span_id for link in sent.links] == [
        trace_spans.span_id(run.correlation_id.int, "step", alpha.pk)
    ]

    # Content went out (internal data, a receiver cleared for it): what each step was sent and answered.
    gamma = next(s for s in steps.values() if s.worker_slug == "gamma")
    gamma_span = by_id[span_id("step", gamma.pk, run)]
    assert gamma_span["attributes"]["output.value"] == "Final: 42"
    assert "Write the final answer" in gamma_span["attributes"]["input.value"]
    assert "draft: 42" in beta_span["attributes"]["input.value"]  # beta was shown alpha's answer
    assert root["attributes"]["input.value"] == "What is 6 * 7?"
    counts = telemetry.counts()
    assert counts.spans_exported >= expected and counts.spans_failed == 0


def test_content_goes_only_to_a_receiver_cleared_for_the_data_class(live_pool, exporting, settings):
    exporting("http://127.0.0.1:9", content_classes=("public",))  # spans are built, not sent here
    run = run_nested(live_pool["server"], text="Internal: what is 6 * 7?")
    spans = trace_spans.run_spans(run.pk)
    assert len(spans) == 11
    for span in spans:
        assert not {"input.value", "output.value", "gen_ai.input.messages", "gen_ai.output.messages"} & set(
            span.attributes
        ), span.name
    root = spans[0]
    assert root.attributes["conductor_web.content_exported"] is False
    assert root.attributes["conductor_web.content_rule"] == CLEARANCE_RULE

    # Cleared for internal data, but a rule keeps internal data from this vendor: no content either.
    settings.OTEL_CONTENT_CLASSES = ["internal"]
    settings.OTEL_RECEIVER_VENDOR = "tracecorp"
    PolicyRule.objects.create(
        name="no-tracecorp",
        kind=PolicyRule.Kind.VENDOR_BLOCKED,
        vendors=["tracecorp"],
        data_classes=["internal"],
    )
    spans = trace_spans.run_spans(run.pk)
    assert spans[0].attributes["conductor_web.content_rule"] == "no-tracecorp"
    assert not any("input.value" in s.attributes for s in spans)

    PolicyRule.objects.all().delete()
    spans = trace_spans.run_spans(run.pk)
    assert spans[0].attributes["conductor_web.content_exported"] is True
    assert spans[0].attributes["input.value"] == "Internal: what is 6 * 7?"


def test_a_receiver_that_is_down_or_failing_never_touches_the_run(live_pool, exporting):
    # Nothing listens on the first; the second (the loopback model server) answers 404 to every export.
    server = live_pool["server"]
    for endpoint in (f"http://127.0.0.1:{free_port()}", server.base_url.removesuffix("/v1")):
        exporting(endpoint)
        before = telemetry.counts()
        run = run_nested(server, text=f"to {endpoint}")
        assert telemetry.flush()
        after = telemetry.counts()
        assert run.status == RunStatus.SUCCEEDED
        assert after.runs - before.runs == 1
        assert after.spans_queued - before.spans_queued == 11
        assert after.spans_failed - before.spans_failed == 11
        assert after.spans_exported == before.spans_exported


def test_each_engine_event_is_a_json_line_with_the_runs_trace_id(live_pool):
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLines())
    handler.addFilter(ContextFilter())
    events = logging.getLogger("routing.events")
    events.addHandler(handler)
    events.setLevel(logging.INFO)
    try:
        run = run_nested(live_pool["server"])
    finally:
        events.removeHandler(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    from audit.models import AuditEvent

    recorded = AuditEvent.objects.filter(correlation_id=run.correlation_id, actor_name="engine").exclude(
        action="run.sealed"
    )
    assert len(lines) == recorded.count() > 10
    assert {line["trace_id"] for line in lines} == {run.correlation_id.hex}
    assert {line["run_id"] for line in lines} == {str(run.pk)}
    assert {line["task_id"] for line in lines} == {str(run.task_id)}
    assert [line["event"] for line in lines] == list(recorded.order_by("id").values_list("action", flat=True))
    assert all(line["time"].endswith("+00:00") for line in lines)


def test_runs_that_ended_before_export_was_on_are_sent_by_the_command(
    live_pool, phoenix, exporting, settings
):
    settings.OTEL_TRACES = False
    run = run_nested(live_pool["server"], text="before the receiver")
    before = telemetry.counts()
    assert telemetry.counts() == before  # export was off: nothing was queued for it
    exporting(phoenix)
    with pytest.raises(CommandError, match="--since"):
        call_command("export_traces", since="yesterday")
    out = io.StringIO()
    call_command("export_traces", runs=[run.pk], stdout=out)
    assert out.getvalue().strip() == "1 runs, 11 spans sent, 0 failed"
    spans = read_back(phoenix, run, 11)
    assert len(spans) == 11
    assert {s["context"]["trace_id"] for s in spans} == {run.correlation_id.hex}

    settings.OTEL_TRACES = False
    with pytest.raises(CommandError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        call_command("export_traces")


def test_log_format_json_writes_a_json_line_with_the_bound_runs_ids(tmp_path):
    """The settings' LOGGING as a process started with LOG_FORMAT=json uses it."""
    script = (
        "import logging, uuid; from types import SimpleNamespace as S; from utilities import structured_logs as log_context;"
        "run = S(pk=7, task_id=uuid.UUID(int=1), correlation_id=uuid.UUID(int=2));"
        "ctx = log_context.bound(run); ctx.__enter__();"
        "logging.getLogger('routing.engine').warning('a step was retried')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LOG_FORMAT",)}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env={**env, "LOG_FORMAT": "json"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert line["message"] == "a step was retried" and line["level"] == "WARNING"
    assert line["trace_id"] == f"{2:032x}" and line["run_id"] == "7"
    assert line["task_id"] == str(uuid.UUID(int=1))

    bad = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**env, "LOG_FORMAT": "xml"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "LOG_FORMAT" in bad.stderr


def test_spans_come_from_the_conductor_web_service_unless_the_standard_variables_say_otherwise(monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    attributes = trace_spans.service_resource().attributes
    assert attributes["service.name"] == "conductor-web"
    assert attributes["openinference.project.name"] == "conductor-web"

    monkeypatch.setenv("OTEL_SERVICE_NAME", "conductor-eu")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=audit-eu,deployment.environment=prod"
    )
    attributes = trace_spans.service_resource().attributes
    assert attributes["service.name"] == "conductor-eu"
    assert attributes["openinference.project.name"] == "audit-eu"
    assert attributes["deployment.environment"] == "prod"
