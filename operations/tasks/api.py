"""The API's task endpoints (a DRF viewset): submit with an idempotency key, list with filters and a cursor, read one task whole, retry."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.models import Role
from accounts.roles import EVERYONE
from audit.services import record_viewed
from operations.tasks.filters import TaskFilter
from operations.tasks.serializers import (
    TaskDetailOutput,
    TaskListOutput,
    TaskSubmitInput,
)
from routing import limits, selectors
from routing.models import Task
from routing.services import TaskSubmission, task_retry, task_submit

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
