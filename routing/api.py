"""The API's task and worker endpoints (DRF viewsets): submit with an idempotency key, list with filters and a cursor, read one task whole; and runs compared side by side."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Role
from accounts.roles import EVERYONE
from audit.services import record_viewed

from . import compare, limits, selectors
from .filters import TaskFilter
from .models import Task
from .serializers import (
    RunComparisonOutput,
    TaskDetailOutput,
    TaskListOutput,
    TaskSubmitInput,
    WorkerOutput,
)
from .services import TaskSubmission, task_retry, task_submit

ONE_TASK = ("retrieve", "retry")  # actions on the task named by its id, whatever the list's filters


class TaskViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    required_roles = {"GET": EVERYONE, "POST": (Role.OPERATOR,)}
    lookup_value_regex = "[0-9a-f-]{36}"

    filterset_class = TaskFilter

    def get_queryset(self):
        return (
            Task.objects.all()
            if self.action in ONE_TASK
            else selectors.with_final_worker(selectors.task_list())
        )

    def filter_queryset(self, queryset):
        # The list's filters select tasks of the list; a task asked for by its id is shown as it is.
        return queryset if self.action in ONE_TASK else super().filter_queryset(queryset)

    def get_serializer_class(self):
        return TaskDetailOutput if self.action == "retrieve" else TaskListOutput

    def retrieve(self, request: Request, *args, **kwargs) -> Response:
        task = selectors.task_detail(task_id=self.get_object().pk)
        record_viewed(request=request, task=task, view="api")
        return Response(TaskDetailOutput(task).data)

    @extend_schema(
        request=TaskSubmitInput,
        responses={
            201: TaskDetailOutput,
            200: TaskDetailOutput,
            409: OpenApiResponse(description="The idempotency key was already used for a different task"),
        },
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)],
        description="Submit a task. The same idempotency key (body or Idempotency-Key header) returns the same "
        "task; giving both with different keys is refused.",
    )
    def create(self, request: Request) -> Response:
        data = TaskSubmitInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        values["idempotency_key"] = _idempotency_key(
            values.get("idempotency_key") or None, request.headers.get("Idempotency-Key") or None
        )
        if values.get("reference") == "":
            values["reference"] = None
        task, created = task_submit(
            submission=TaskSubmission(**values), source=Task.Source.API, user=request.user
        )
        body = TaskDetailOutput(selectors.task_detail(task_id=task.pk)).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        request=None,
        responses={
            202: TaskDetailOutput,
            400: OpenApiResponse(description="The task has not failed, or its content was purged"),
        },
        description="Run a failed task again: a new run (kind retry) with the active conductor, queued at "
        "once. Its failed runs stay as they were.",
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        task_retry(task_id=task.pk, user=request.user)
        body = TaskDetailOutput(selectors.task_detail(task_id=task.pk)).data
        return Response(body, status=status.HTTP_202_ACCEPTED)


def _idempotency_key(field: str | None, header: str | None) -> str | None:
    """The key of the body's idempotency_key field or of the Idempotency-Key header; both only if equal."""
    if header is not None and len(header) > limits.IDEMPOTENCY_KEY_MAX_CHARS:
        raise ValidationError(
            f"the Idempotency-Key header is longer than {limits.IDEMPOTENCY_KEY_MAX_CHARS} characters"
        )
    if field is not None and header is not None and field != header:
        raise ValidationError(
            {
                "idempotency_key": [
                    f"the idempotency_key field ({field!r}) and the Idempotency-Key header ({header!r}) "
                    "differ; send one key, or the same key in both"
                ]
            }
        )
    return field or header


class WorkerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    required_roles = {"GET": EVERYONE}
    serializer_class = WorkerOutput
    lookup_field = "slug"
    pagination_class = None

    def get_queryset(self):
        return selectors.worker_list()


class RunCompareView(APIView):
    """Two to four runs side by side, as the compare page shows them (routing.compare)."""

    required_roles = {"GET": EVERYONE}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                compare.RUN_PARAM,
                int,
                many=True,
                required=True,
                explode=True,
                description=f"A run id; {compare.MIN_RUNS} to {compare.MAX_RUNS} of them: ?run=12&run=15",
            )
        ],
        responses={
            200: RunComparisonOutput,
            400: OpenApiResponse(
                description="Fewer than two or more than four run ids, one given twice, or an id that is no run"
            ),
        },
        description="The runs' conductors, outcomes, plans (steps aligned by position), answers, costs, "
        "latencies and tokens, row by row, each row saying whether it differs between the runs. "
        "Recorded as a view of each run's task.",
    )
    def get(self, request: Request) -> Response:
        runs = compare.runs_for_compare(compare.run_ids(request.query_params))
        for task in {run.task_id: run.task for run in runs}.values():
            record_viewed(request=request, task=task, view="run comparison (api)")
        return Response(RunComparisonOutput(compare.compare_runs(runs)).data)
