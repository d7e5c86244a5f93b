"""The auditors' API on tasks (/api/audit/, beside audit's own endpoints): vendor exposure and a
task's dossier as a bundle that carries its own proof (compliance.dossier_bundle; `python -m
audit.bundle verify` checks it with the public key alone)."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit import inclusion, policies
from audit.services import record_viewed
from routing import selectors
from routing.models import Task
from utilities import params

from . import dossiers
from .api import PERIOD, READ
from .dossier_bundle import dossier_bundle


class VendorReportView(APIView):
    """Which vendors received data of which class in the period: calls, tasks, tokens and cost; with
    `vendor` and `classification`, also the newest tasks whose content reached that vendor."""

    required_roles = READ

    @extend_schema(
        parameters=[
            *PERIOD,
            OpenApiParameter("vendor", str, description="With classification: list that vendor's tasks"),
            OpenApiParameter("classification", str, description="A data class"),
        ],
        responses=inline_serializer(
            "VendorReport",
            {
                "rows": serializers.ListField(child=serializers.DictField()),
                "tasks": serializers.ListField(child=serializers.UUIDField(), allow_null=True),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        since, until = params.period(request.query_params)
        vendor = params.text(request.query_params, "vendor")
        classification = params.choice(request.query_params, "classification", policies.data_classes())
        rows = [
            {
                "vendor": r["vendor"],
                "classification": r["run__task__classification"],
                "tasks": r["tasks"],
                "steps": r["steps"],
                "judged": r["judged"],
                "input_tokens": r["input_tokens"],
                "output_tokens": r["output_tokens"],
                "cost_usd": str(r["cost"]),
            }
            for r in dossiers.vendor_exposure(since=since, until=until)
        ]
        tasks = (
            [
                t.pk
                for t in dossiers.vendor_tasks(
                    vendor=vendor, classification=classification, since=since, until=until
                )
            ]
            if vendor and classification
            else None
        )
        return Response({"rows": rows, "tasks": tasks})


def _task(task_id: Any) -> Task:
    try:
        return selectors.task_detail(task_id=task_id)
    except Task.DoesNotExist as exc:
        raise Http404("No such task") from exc


class DossierView(APIView):
    """A task's dossier as a bundle: the task, its runs, the run chains' events, their seals and the
    signed checkpoint that covers them. Recorded as a view of the task, as the page's export is."""

    required_roles = READ

    @extend_schema(responses=OpenApiResponse(OpenApiTypes.OBJECT, description="The dossier bundle"))
    def get(self, request: Request, task_id) -> Response:
        task = _task(task_id)
        record_viewed(request=request, task=task, view="dossier export (bundle, api)")
        return Response(dossier_bundle(task, exported_by=request.user.get_username()))


class LogInclusionView(APIView):
    """Each run of a task and its place in the log: its leaf, its index, the audit path (RFC 9162
    2.1.3) and the signed tree head it leads to; null for a run not in a signed tree head yet (open,
    or sealed within the last sealing interval). Checks offline with the public key alone."""

    required_roles = READ

    @extend_schema(responses=OpenApiResponse(OpenApiTypes.OBJECT, description="The runs' inclusion proofs"))
    def get(self, request: Request, task_id) -> Response:
        task = _task(task_id)
        runs, head = [], inclusion.latest_tree_head()
        for run in task.runs.order_by("pk"):
            chain = f"run:{run.correlation_id}"
            proof = inclusion.of_chain(chain, head=head)
            runs.append(
                {
                    "run": run.pk,
                    "chain": chain,
                    "status": run.status,
                    "log": proof.document() if proof else None,
                }
            )
        return Response({"task": str(task.pk), "runs": runs})
