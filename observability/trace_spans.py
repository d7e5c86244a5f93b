"""A run's spans, made from its committed rows (GenAI semantic conventions, OpenInference names).

A run is a trace, and its trace id is the run's correlation id. Its rows become spans: the run
(`invoke_agent`), each of the conductor's plans, each step, each provider call of a step
(`chat <model>`); a nested plan and its steps sit under the conductor step that made them; a step
links to the spans of the steps it saw (its access list). Every span carries the record's own
figures: tokens, cost (exact, as a decimal string, and as a float for trace tools), status, error
type. The spans' timestamps are the record's, and a span's id is made from what it records, so the
same run exported twice gives the same spans.

Message content (the task, what each worker was sent and answered, the conductor's prompt and
output) is included only for the data classes the receiver is cleared for
(CONDUCTOR_OTEL_CONTENT_CLASSES), and only when the receiver, described like a worker (vendor,
region, self-hosted), passes the same policy rules a worker call passes (audit.policies.judge).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.utils import timezone
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from audit import policies
from routing.models import Attempt, Decision, Run, RunStatus, Step, StepStatus
from routing.plans import visible_indices

SCOPE = InstrumentationScope("conductor_web.routing", "1")
# Content longer than this is cut (with a marker) so that one huge task cannot fill the queue.
MAX_CONTENT_CHARS = 32_768
# Phoenix files spans under the project its resource names (other receivers ignore the attribute).
PROJECT_ATTRIBUTE = "openinference.project.name"


def service_resource() -> Resource:
    """Who sends the spans: `conductor-web` (service and Phoenix project), unless the standard
    OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise."""
    defaults = {"service.name": "conductor-web", PROJECT_ATTRIBUTE: "conductor-web"}
    return Resource.create({**defaults, **OTELResourceDetector().detect().attributes})


def receiver() -> Any:
    """The trace receiver as the policy rules see a worker."""
    return SimpleNamespace(
        slug="otlp-receiver",
        vendor=settings.OTEL_RECEIVER_VENDOR,
        region=settings.OTEL_RECEIVER_REGION,
        self_hosted=settings.OTEL_RECEIVER_SELF_HOSTED,
        data_classes=list(settings.OTEL_CONTENT_CLASSES),
    )


def content_verdict(classification: str) -> policies.Verdict:
    """Whether a task's content may go to the trace receiver: the check of a worker call."""
    return policies.judge(receiver(), classification, policies.active_rules())


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def span_id(trace_id: int, kind: str, pk: int) -> int:
    """A span's id from what it records: the same run exported twice gives the same spans."""
    digest = hashlib.sha256(f"{trace_id:032x}:{kind}:{pk}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _cut(text: str) -> str:
    if len(text) <= MAX_CONTENT_CHARS:
        return text
    return text[:MAX_CONTENT_CHARS] + f"… [{len(text) - MAX_CONTENT_CHARS} characters cut]"


def _messages(messages: list[dict[str, Any]] | None) -> str:
    """Messages as GenAI's `gen_ai.input.messages` writes them: role and text parts."""
    return _cut(
        json.dumps(
            [
                {"role": m.get("role", "user"), "parts": [{"type": "text", "content": m.get("content", "")}]}
                for m in (messages or [])
            ],
            ensure_ascii=False,
        )
    )


def _answer(text: str) -> str:
    return _cut(
        json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}], ensure_ascii=False)
    )


def _figures(cost: Any, input_tokens: int, output_tokens: int, *, call: bool) -> dict[str, Any]:
    """The record's tokens and cost. Usage attributes go on the spans of calls only (provider calls,
    the conductor's plans): receivers add them up over a trace, so a run's or step's totals, which
    are sums of its calls, carry only this project's own names."""
    own = {
        "conductor_web.input_tokens": input_tokens,
        "conductor_web.output_tokens": output_tokens,
        "conductor_web.cost_usd": str(cost),  # exact: the record's Decimal
    }
    if not call:
        return own
    return own | {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        # The OpenInference names Phoenix shows and adds up; the cost a float, for display only.
        "llm.token_count.prompt": input_tokens,
        "llm.token_count.completion": output_tokens,
        "llm.token_count.total": input_tokens + output_tokens,
        "llm.cost.total": float(cost),
    }


def _model_attributes(vendor: str, model: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if vendor:
        out |= {"gen_ai.provider.name": vendor, "gen_ai.system": vendor, "llm.provider": vendor}
    if model:
        out |= {"gen_ai.request.model": model, "gen_ai.response.model": model, "llm.model_name": model}
    return out


class _Trace:
    """The spans of one run, parents before children."""

    def __init__(self, run: Run, resource: Resource | None, *, end: datetime) -> None:
        self.run = run
        self.end = end  # the run's end, or now for a run still going: where open spans stop
        self.trace_id = run.correlation_id.int
        self.resource = resource or service_resource()
        self.spans: list[ReadableSpan] = []
        self.root = self.context("run", run.pk)

    def parent_of(self, decision_parent_step: int | None) -> SpanContext:
        """A plan's or step's parent: the run at depth 0, the conductor step that planned it below."""
        return self.root if decision_parent_step is None else self.context("step", decision_parent_step)

    def context(self, kind: str, pk: int) -> SpanContext:
        return SpanContext(
            trace_id=self.trace_id,
            span_id=span_id(self.trace_id, kind, pk),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )

    def add(
        self,
        name: str,
        own: SpanContext,
        parent: SpanContext | None,
        start: datetime,
        end: datetime,
        attributes: dict[str, Any],
        *,
        error: str = "",
        ok: bool = False,
        links: list[Link] | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> None:
        end = max(end, start)
        # OK where the record says it succeeded; UNSET where it has no verdict (a skipped step).
        status = (
            Status(StatusCode.ERROR, error[:1000])
            if error
            else Status(StatusCode.OK if ok else StatusCode.UNSET)
        )
        clean = {k: v for k, v in attributes.items() if v is not None and v != ""}
        self.spans.append(
            ReadableSpan(
                name=name,
                context=own,
                parent=parent,
                resource=self.resource,
                attributes=clean,
                links=links or [],
                kind=kind,
                status=status,
                start_time=_ns(start),
                end_time=_ns(end),
                instrumentation_scope=SCOPE,
            )
        )


def run_spans(run_id: int, *, resource: Resource | None = None) -> list[ReadableSpan]:
    """A finished run's spans, from its committed rows."""
    run = Run.objects.select_related("task", "conductor_version").get(pk=run_id)
    decisions = list(Decision.objects.filter(run=run).order_by("depth", "pk"))
    steps = list(
        Step.objects.filter(run=run).select_related("worker").order_by("depth", "decision_id", "index")
    )
    attempts = list(Attempt.objects.filter(step__run=run).order_by("step_id", "number"))
    verdict = content_verdict(run.task.classification)
    content = verdict.allowed and run.task.purged_at is None
    trace = _Trace(run, resource, end=run.finished_at or timezone.now())
    _run_span(trace, verdict, content=content)
    _decision_spans(trace, decisions, content=content)
    _step_spans(trace, steps, decisions, content=content)
    _attempt_spans(trace, attempts, steps, content=content)
    return trace.spans


def _run_span(trace: _Trace, verdict: policies.Verdict, *, content: bool) -> None:
    """The run's span (`invoke_agent`), the trace's root."""
    run, task = trace.run, trace.run.task
    version = run.conductor_version
    failed = run.status == RunStatus.FAILED
    trace.add(
        f"invoke_agent conductor {version.name}",
        trace.root,
        None,
        run.started_at or run.created_at,
        trace.end,
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "conductor",
            "gen_ai.agent.id": version.name,
            "gen_ai.conversation.id": str(run.correlation_id),
            "openinference.span.kind": "AGENT",
            "conductor_web.run.id": run.pk,
            "conductor_web.run.kind": run.kind,
            "conductor_web.run.status": run.status,
            "conductor_web.run.deliveries": run.deliveries,
            "conductor_web.task.id": str(task.pk),
            "conductor_web.task.domain": task.domain,
            "conductor_web.data_class": task.classification,
            "conductor_web.conductor.version": version.name,
            "conductor_web.conductor.backend": version.backend,
            "conductor_web.stop_reason": run.stop_reason,
            "conductor_web.score": run.score,
            "conductor_web.content_exported": content,
            "conductor_web.content_rule": verdict.rule if not verdict.allowed else None,
            "error.type": (run.stop_reason or "failed") if failed else None,
            **_figures(run.cost_usd, run.input_tokens, run.output_tokens, call=False),
            **({"input.value": _cut(task.text), "output.value": _cut(run.final_answer)} if content else {}),
        },
        error=run.error if failed else "",
        ok=run.status == RunStatus.SUCCEEDED,
    )


def _decision_spans(trace: _Trace, decisions: list[Decision], *, content: bool) -> None:
    """Each of the conductor's plans: a `chat` span for an LLM conductor, a `plan` span otherwise."""
    conductor_model = str((trace.run.conductor_version.config or {}).get("model", ""))
    for d in decisions:
        end = d.created_at
        start = end - timedelta(milliseconds=d.latency_ms)
        llm = d.backend == "llm"
        trace.add(
            f"chat {conductor_model}" if llm and conductor_model else f"plan {d.version_name}",
            trace.context("decision", d.pk),
            trace.parent_of(d.parent_step_id),
            start,
            end,
            {
                **({"gen_ai.operation.name": "chat"} if llm else {}),
                **_model_attributes(
                    conductor_model.split("/", 1)[0] if llm else "", conductor_model if llm else ""
                ),
                "openinference.span.kind": "LLM" if llm else "CHAIN",
                "conductor_web.plan.id": d.pk,
                "conductor_web.plan.depth": d.depth,
                "conductor_web.plan.attempt": d.attempt,
                "conductor_web.plan.valid": d.valid,
                "conductor_web.plan.backend": d.backend,
                "conductor_web.plan.steps": len((d.plan or {}).get("steps", [])) if d.valid else 0,
                "conductor_web.plan.blocked_by": d.blocked_by,
                "error.type": None if d.valid else "invalid_plan",
                **_figures(d.cost_usd, d.input_tokens, d.output_tokens, call=True),
                **(
                    {
                        "gen_ai.input.messages": _messages(d.prompt),
                        "gen_ai.output.messages": _answer(d.raw_output),
                        "input.value": _messages(d.prompt),
                        "input.mime_type": "application/json",
                        "output.value": _cut(d.raw_output),
                    }
                    if content
                    else {}
                ),
            },
            error="" if d.valid else d.error,
            ok=d.valid,
        )


def _step_spans(trace: _Trace, steps: list[Step], decisions: list[Decision], *, content: bool) -> None:
    """Each step, linked to the steps it saw; a conductor step that planned a nested level is an agent."""
    run_end = trace.end
    by_decision = {d.pk: d for d in decisions}
    step_at = {(s.decision_id, s.index): s for s in steps}
    for s in steps:
        decision = by_decision[s.decision_id]
        start = s.started_at or run_end
        end = s.finished_at or (start if s.started_at is None else run_end)
        model = s.worker.litellm_model if s.worker else ""
        saw = [
            step_at[(s.decision_id, i)]
            for i in visible_indices(s.access, s.index)
            if (s.decision_id, i) in step_at
        ]
        nested = s.worker is None and any(d.parent_step_id == s.pk for d in decisions)
        trace.add(
            f"step {s.depth}.{s.index} {s.worker_slug}" if s.depth else f"step {s.index} {s.worker_slug}",
            trace.context("step", s.pk),
            trace.parent_of(decision.parent_step_id),
            start,
            end,
            {
                **_model_attributes(s.vendor, model),
                "openinference.span.kind": "AGENT" if nested else "CHAIN",
                "conductor_web.step.id": s.pk,
                "conductor_web.step.index": s.index,
                "conductor_web.step.depth": s.depth,
                "conductor_web.step.worker": s.worker_slug,
                "conductor_web.step.status": s.status,
                "conductor_web.step.sees": [e.index for e in saw],
                "conductor_web.step.latency_ms": s.latency_ms,
                "error.type": "step_failed" if s.status == StepStatus.FAILED else None,
                **_figures(s.cost_usd, s.input_tokens, s.output_tokens, call=False),
                **(
                    {
                        "input.value": _messages(s.messages_sent) if s.messages_sent else _cut(s.instruction),
                        "input.mime_type": "application/json" if s.messages_sent else "text/plain",
                        "output.value": _cut(s.response),
                    }
                    if content
                    else {}
                ),
            },
            error=s.error if s.status == StepStatus.FAILED else "",
            ok=s.status == StepStatus.SUCCEEDED,
            links=[Link(trace.context("step", e.pk), {"conductor_web.link": "saw"}) for e in saw],
        )


def _attempt_spans(trace: _Trace, attempts: list[Attempt], steps: list[Step], *, content: bool) -> None:
    """Each provider call (`chat <model>`, a client span) under its step."""
    run_end = trace.end
    step_of = {s.pk: s for s in steps}
    for a in attempts:
        s = step_of[a.step_id]
        model = s.worker.litellm_model if s.worker else ""
        succeeded = a.status == Attempt.Status.SUCCEEDED
        end = a.finished_at or (
            a.started_at + timedelta(milliseconds=a.latency_ms) if a.latency_ms is not None else run_end
        )
        trace.add(
            f"chat {model or s.worker_slug}",
            trace.context("attempt", a.pk),
            trace.context("step", s.pk),
            a.started_at,
            end,
            {
                "gen_ai.operation.name": "chat",
                **_model_attributes(s.vendor, model),
                "openinference.span.kind": "LLM",
                "gen_ai.response.id": a.provider_request_id,
                "http.response.status_code": a.http_status,
                "error.type": a.status if a.status in Attempt.ERRORS else None,
                "conductor_web.attempt.id": a.pk,
                "conductor_web.attempt.number": a.number,
                "conductor_web.attempt.status": a.status,
                "conductor_web.cost_estimated": a.cost_estimated,
                **_figures(a.cost_usd, a.input_tokens, a.output_tokens, call=True),
                **(
                    {
                        "gen_ai.input.messages": _messages(s.messages_sent),
                        "input.value": _messages(s.messages_sent),
                        "input.mime_type": "application/json",
                        **(
                            {"gen_ai.output.messages": _answer(s.response), "output.value": _cut(s.response)}
                            if succeeded
                            else {}
                        ),
                    }
                    if content and s.messages_sent
                    else {}
                ),
            },
            error=a.error if a.status in Attempt.ERRORS else "",
            ok=succeeded,
            kind=SpanKind.CLIENT,
        )
