from datetime import datetime

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from observability import telemetry
from routing.models import Run, RunStatus


class Command(BaseCommand):
    help = (
        "Send finished runs to the OTLP endpoint as traces (runs that ended before export was on, or a "
        "new receiver). A run sent again has the same trace and span ids."
    )

    def add_arguments(self, parser):
        parser.add_argument("--run", type=int, action="append", dest="runs", help="a run id (repeatable)")
        parser.add_argument("--since", help="runs that finished at or after this ISO 8601 time (with zone)")
        parser.add_argument("--limit", type=int, default=1000, help="at most this many runs, newest first")

    def handle(self, *args, **o):
        if not settings.OTEL_TRACES:
            raise CommandError(
                "no OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT (see docs/observability.md)"
            )
        runs = Run.objects.filter(status__in=(RunStatus.SUCCEEDED, RunStatus.FAILED))
        if o["runs"]:
            runs = runs.filter(pk__in=o["runs"])
        if o["since"]:
            since = parse_datetime(o["since"])
            if not isinstance(since, datetime) or since.tzinfo is None:
                raise CommandError(f"--since: not an ISO 8601 time with a zone: {o['since']!r}")
            runs = runs.filter(finished_at__gte=since)
        if o["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        ids = list(runs.order_by("-finished_at").values_list("pk", flat=True)[: o["limit"]])
        before = telemetry.counts()
        for run_id in ids:
            telemetry.export_run(run_id)
        telemetry.flush()
        after = telemetry.counts()
        sent = after.spans_exported - before.spans_exported
        failed = after.spans_failed - before.spans_failed
        self.stdout.write(f"{len(ids)} runs, {sent} spans sent, {failed} failed")
        if failed:
            raise CommandError(f"{failed} spans could not be delivered (see the log)")
