"""The auditors' API: what the audit pages show, for scripts with an auditor's API token.

Pages know sessions only; a token opens /api/. Each endpoint here answers the roles of its page
(auditors; admins pass every role check) and writes the same audit events the page writes.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, renderers, serializers, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.roles import AUDIT_ROLES
from audit import log, signing
from audit.actions import Action
from audit.exports import FIELDS, checkpoint_reference, export_response
from audit.filters import AuditEventFilter
from audit.inclusion import latest_tree_head
from audit.models import AuditEvent
from audit.services import Actor, event_record
from audit.verify import verify
from utilities import params
from utilities.params import InvalidParameter

from . import selectors
from .pagination import EventCursorPagination

READ = {"GET": AUDIT_ROLES, "HEAD": AUDIT_ROLES, "OPTIONS": AUDIT_ROLES}
PERIOD = [
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="From this moment (or date)"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="Before this moment (a date: to its end)"),
]


class EventOutput(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = FIELDS  # the exports' columns: one record, one shape


class EventViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The audit events, newest first, with the event log's filters; each with its chain position and
    hashes, to verify against a signed checkpoint."""

    required_roles = READ
    queryset = AuditEvent.objects.all()
    serializer_class = EventOutput
    filterset_class = AuditEventFilter
    pagination_class = EventCursorPagination


class StreamRenderer(renderers.BaseRenderer):
    """The export's media types, for content negotiation; the body is streamed by the view."""

    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> Any:
        return data


class JsonLinesRenderer(StreamRenderer):
    media_type, format = "application/x-ndjson", "jsonl"


class CsvRenderer(StreamRenderer):
    media_type, format = "text/csv", "csv"


class EventExportView(APIView):
    """The events with the event log's filters, streamed whole, as the page's export: JSON lines or
    CSV, a last line naming the signed checkpoint; recorded as an `audit.exported` event."""

    required_roles = READ
    renderer_classes = [JsonLinesRenderer, CsvRenderer]
    fmt = "jsonl"

    @extend_schema(
        parameters=[
            *PERIOD,
            OpenApiParameter("action", str, description="Actions that start with this"),
            OpenApiParameter("actor", str),
            OpenApiParameter("task", OpenApiTypes.UUID),
            OpenApiParameter("object_type", str),
            OpenApiParameter("chain", str),
            OpenApiParameter("q", str, description="An object id, or words of an actor's name or action"),
        ],
        responses={(200, "application/x-ndjson"): OpenApiTypes.STR, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        return export_response(request._request, self.fmt, via="api")


class EventExportCsvView(EventExportView):
    renderer_classes = [CsvRenderer, JsonLinesRenderer]
    fmt = "csv"


class PolicyReportView(APIView):
    """The policy report: the rules, and the blocks and rule changes of the period, newest first."""

    required_roles = READ

    @extend_schema(
        parameters=PERIOD,
        responses=inline_serializer(
            "PolicyReport",
            {
                "rules": serializers.ListField(child=serializers.DictField()),
                "events": serializers.ListField(child=serializers.DictField()),
                "shown": serializers.IntegerField(help_text="At most this many events, the newest"),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        since, until = params.period(request.query_params)
        rules = [
            {
                "name": r.name,
                "kind": r.kind,
                "data_classes": r.data_classes,
                "vendors": r.vendors,
                "regions": r.regions,
                "description": r.description,
                "enabled": r.enabled,
            }
            for r in selectors.policy_rules()
        ]
        events = selectors.policy_events(since=since, until=until)
        return Response({"rules": rules, "events": events, "shown": selectors.POLICY_EVENTS_SHOWN})


class VerifyView(APIView):
    """POST: verify the whole record (every chain, every row an auditor reads, against the signed
    checkpoints), as the verify page does, recorded as an `audit.verified` event. GET: the newest
    signed checkpoint, what a verification is anchored to."""

    required_roles = {**READ, "POST": AUDIT_ROLES}

    @extend_schema(responses=OpenApiResponse(OpenApiTypes.OBJECT, description="The newest signed checkpoint"))
    def get(self, request: Request) -> Response:
        return Response({"checkpoint": checkpoint_reference()})

    @extend_schema(
        request=None,
        responses=inline_serializer(
            "VerifyReport",
            {
                "intact": serializers.BooleanField(),
                "summary": serializers.CharField(),
                "problems": serializers.ListField(child=serializers.CharField()),
            },
        ),
    )
    def post(self, request: Request) -> Response:
        report = verify()
        record(
            request._request, Action.AUDIT_VERIFIED, {"intact": report.intact, "summary": report.summary()}
        )
        return Response(
            {
                "intact": report.intact,
                "summary": report.summary(),
                "problems": [p.sentence() for p in report.problems],
            }
        )


class PublicKeyView(APIView):
    """The public key verification trusts (PEM), with its fingerprint: what `python -m audit.bundle
    verify --public-key` takes to check a dossier bundle. Compare `key_id` with each checkpoint's."""

    required_roles = READ

    @extend_schema(
        responses=inline_serializer(
            "AuditPublicKey",
            {
                "pem": serializers.CharField(help_text="The Ed25519 public key, PEM (SubjectPublicKeyInfo)"),
                "key_id": serializers.CharField(help_text="As each signed checkpoint names its key"),
                "sha256": serializers.CharField(help_text="SHA-256 of the raw key, hex"),
            },
        )
    )
    def get(self, request: Request) -> Response:
        offered = signing.public_key_offered()
        if offered is None:
            raise NotFound("no audit signing key yet")
        return Response(offered)


MAX_LEAVES = 10**15


class LogCheckpointView(APIView):
    """The log's latest signed tree head, as its file holds it: a C2SP checkpoint note (text/plain),
    what a witness keeps and what `manage.py audit_witness` and any tlog verifier read."""

    required_roles = READ
    renderer_classes = [renderers.StaticHTMLRenderer]

    @extend_schema(responses=OpenApiResponse(OpenApiTypes.STR, description="The signed checkpoint note"))
    def get(self, request: Request) -> HttpResponse:
        head = latest_tree_head()
        if head is None:
            raise NotFound("the log has no signed tree head yet")
        return HttpResponse(head.note, content_type="text/plain; charset=utf-8")


class LogConsistencyView(APIView):
    """The proof (RFC 9162 2.1.4) that the tree of `to` leaves (default: the latest signed tree head's)
    extends the tree of `from` leaves: what an auditor holding an old checkpoint checks
    (audit.witness.check, or any RFC 9162 verifier)."""

    required_roles = READ

    @extend_schema(
        parameters=[
            OpenApiParameter("from", int, description="The size of the tree you kept (default: the latest)"),
            OpenApiParameter("to", int, description="The size to prove (default: the latest signed)"),
        ],
        responses=OpenApiResponse(OpenApiTypes.OBJECT, description="from, to, proof (hex), checkpoint"),
    )
    def get(self, request: Request) -> Response:
        head = latest_tree_head()
        if head is None:
            raise NotFound("the log has no signed tree head yet")
        signed = head.body["tree"]["size"]
        second = params.integer(request.query_params, "to", default=signed, maximum=MAX_LEAVES)
        first = params.integer(request.query_params, "from", default=second, maximum=MAX_LEAVES)
        assert first is not None and second is not None
        if second > signed:
            raise InvalidParameter("to", f"the latest signed tree head has {signed} leaves")
        if first > second:
            raise InvalidParameter("from", f"must be at most {second}: a log only grows")
        return Response(
            {
                "from": first,
                "to": second,
                "proof": [h.hex() for h in log.consistency(first, second)],
                "checkpoint": head.note if second == signed else None,
            }
        )


def record(request: HttpRequest, action: str, payload: dict[str, Any]) -> None:
    """An auditor's act through the API, as the pages record theirs (the user acts on itself)."""
    with transaction.atomic():
        event_record(
            actor=Actor.for_user(request.user),
            action=action,
            obj=request.user,
            payload={**payload, "via": "api"},
        )
