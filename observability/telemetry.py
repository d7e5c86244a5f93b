"""OpenTelemetry traces of runs, made from the record (OTLP over HTTP, GenAI semantic conventions).

A run is a trace, and its trace id is the run's correlation id (the `trace_id` of its log lines,
utilities.structured_logs). When a run ends, after the transaction that ends it commits, its rows become
spans (observability.trace_spans): the run (`invoke_agent`), each of the conductor's plans, each step, each provider call of a
step (`chat <model>`); a nested plan and its steps sit under the conductor step that made them; a
step links to the spans of the steps it saw (its access list). Every span carries the record's own
figures: tokens, cost (exact, as a decimal string, and as a float for trace tools), status, error
type. Built from the committed rows, a run resumed by another process is still one trace, and what a
receiver shows equals the database. The spans' timestamps are the record's.

Off unless an OTLP endpoint is set (settings.OTEL_TRACES). Export never slows or breaks a run: the
spans go through the SDK's batch processor (a bounded queue, a background thread); failures and
dropped spans are counted (`counts()`) and logged, never raised.

Message content (the task, what each worker was sent and answered, the conductor's prompt and
output) is exported only for the data classes the receiver is cleared for
(CONDUCTOR_OTEL_CONTENT_CLASSES), and only when the receiver, described like a worker (vendor,
region, self-hosted), passes the same policy rules a worker call passes (audit.policies.judge).
"""

from __future__ import annotations

import atexit
import logging
import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from observability.trace_spans import run_spans, service_resource
from routing.models import Run

log = logging.getLogger(__name__)


@dataclass
class Counts:
    """What this process handed to the exporter: spans queued, sent, failed, and runs whose spans
    could not be built. A span the full queue had no room for shows as neither sent nor failed."""

    runs: int = 0
    runs_failed: int = 0
    spans_queued: int = 0
    spans_exported: int = 0
    spans_failed: int = 0


_counts = Counts()
_lock = threading.Lock()
_processor: BatchSpanProcessor | None = None
_resource: Resource | None = None


def counts() -> Counts:
    return Counts(**vars(_counts))


class _Counted(SpanExporter):
    """The OTLP exporter, its results counted and its failures logged instead of raised."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Any) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - an exporter's bug must not reach the run
            log.warning("trace export failed: %s: %s", type(exc).__name__, exc)
            result = SpanExportResult.FAILURE
        with _lock:
            if result is SpanExportResult.SUCCESS:
                _counts.spans_exported += len(spans)
            else:
                _counts.spans_failed += len(spans)
        if result is not SpanExportResult.SUCCESS:
            log.warning("trace export failed: %d spans not delivered", len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def processor() -> BatchSpanProcessor | None:
    """This process's batch processor (made on first use; it survives a fork), or None when off."""
    global _processor, _resource
    if not settings.OTEL_TRACES:
        return None
    with _lock:
        if _processor is None:
            # start-up: the OTLP exporter (protobuf, requests) is loaded only when traces are on
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            _resource = service_resource()
            _processor = BatchSpanProcessor(_Counted(OTLPSpanExporter()))
            atexit.register(shutdown)
        return _processor


def flush(timeout_s: float = 30.0) -> bool:
    """Send what is queued now (tests, commands, a worker process that is about to exit)."""
    current = processor()
    return current.force_flush(int(timeout_s * 1000)) if current is not None else True


def shutdown() -> None:
    """Send what is queued and stop this process's exporter; the next export starts a new one."""
    global _processor
    with _lock:
        current, _processor = _processor, None
    if current is not None:
        current.shutdown()


def on_run_finished(sender: Any, run: Run, **_: Any) -> None:
    """routing.signals.run_finished: export the run once the transaction that ended it commits."""
    if settings.OTEL_TRACES:
        transaction.on_commit(lambda: export_run(run.pk))


def export_run(run_id: int) -> int:
    """Queue a run's spans for export; the number queued (0 when off or on failure). Never raises."""
    current = processor()
    if current is None:
        return 0
    try:
        spans = run_spans(run_id, resource=_resource)
    except Exception:  # noqa: BLE001 - a trace is never worth a run
        log.exception("run %s: its trace could not be built", run_id)
        with _lock:
            _counts.runs_failed += 1
        return 0
    for span in spans:
        current.on_end(span)
    with _lock:
        _counts.runs += 1
        _counts.spans_queued += len(spans)
    return len(spans)
