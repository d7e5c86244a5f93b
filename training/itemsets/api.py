"""The item sets' API: what /training/itemsets/ does, for ML staff's scripts. Sets by name."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db.models import Count, Prefetch
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from audit.services import Actor
from operations.saved_views.services import visible_views
from routing.limits import name_check
from routing.models import Task
from utilities import params
from utilities.pagination import StrictCursorPagination

from ..api import REFUSED, TrainingViewSet
from ..models import Item, ItemSet, ItemSetVersion
from . import rows, services
from .selectors import view_tasks
from .views import export_response


class VersionOutput(serializers.ModelSerializer):
    items = serializers.IntegerField(source="item_count", read_only=True)

    class Meta:
        model = ItemSetVersion
        fields = ["number", "frozen_at", "content_hash", "items", "created_at"]


class ItemSetOutput(serializers.ModelSerializer):
    versions = VersionOutput(many=True, read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = ItemSet
        fields = ["name", "description", "seed", "versions", "created_by", "created_at"]


class ItemOutput(serializers.ModelSerializer):
    id = serializers.CharField(source="key")
    data_class = serializers.CharField(source="classification")

    class Meta:
        model = Item
        fields = ["id", "text", "reference", "scorer", "kind", "data_class", "split", "origin", "source_task",
                  "source_run", "verdict", "purged_at"]  # fmt: skip


class UploadInput(serializers.Serializer):
    name = serializers.CharField(validators=[name_check], help_text="The set (created when new)")
    description = serializers.CharField(required=False, default="", allow_blank=True, max_length=500)
    file = serializers.FileField(
        help_text="JSON Lines or CSV (UTF-8): id, text, reference, scorer, kind, data_class, split"
    )


class AddTasksInput(serializers.Serializer):
    tasks = serializers.ListField(child=serializers.UUIDField(), required=False, max_length=rows.MAX_ROWS)
    view = serializers.IntegerField(required=False, min_value=1, help_text="A saved view of the task list")
    kind = serializers.CharField(required=False, default="", allow_blank=True, max_length=40)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("tasks" in attrs) == ("view" in attrs):
            raise serializers.ValidationError("give tasks or a view, one of the two")
        return attrs


class AddedOutput(serializers.Serializer):
    item_set = serializers.CharField()
    version = serializers.IntegerField()
    added = serializers.IntegerField()
    skipped = serializers.ListField(child=serializers.CharField())


class ItemPagination(StrictCursorPagination):
    ordering = ("key",)  # unique in a version


def _added(version: ItemSetVersion, added: int, skipped: list[str]) -> Response:
    body = {"item_set": version.item_set.name, "version": version.number, "added": added, "skipped": skipped}
    return Response(AddedOutput(body).data, status=status.HTTP_201_CREATED)


class ItemSetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TrainingViewSet):
    """A team's item sets: upload, add logged tasks, read, export."""

    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9][A-Za-z0-9_-]{0,79}"
    serializer_class = ItemSetOutput

    def get_queryset(self):
        versions = ItemSetVersion.objects.annotate(item_count=Count("items")).order_by("-number")
        return ItemSet.objects.select_related("created_by").prefetch_related(
            Prefetch("versions", queryset=versions)
        )

    def _version(self, request: Request, name: str) -> ItemSetVersion:
        number = params.integer(request.query_params, "set_version", minimum=1, maximum=2**31 - 1)
        versions = ItemSetVersion.objects.select_related("item_set").filter(item_set__name=name)
        found = versions.filter(number=number).first() if number else versions.order_by("-number").first()
        if found is None:
            raise NotFound("no such item set or version")
        return found

    @extend_schema(request={"multipart/form-data": UploadInput}, responses={201: AddedOutput, 400: REFUSED},
                   description="Upload a file of items into a set (created when new). A bad row refuses the "
                   "whole file: the error lists each row's line and reason.")  # fmt: skip
    def create(self, request: Request) -> Response:
        data = UploadInput(data=request.data)
        data.is_valid(raise_exception=True)
        upload = data.validated_data["file"]
        if upload.size > rows.MAX_FILE_BYTES:
            raise serializers.ValidationError(
                {"file": f"{upload.size:,} bytes; at most {rows.MAX_FILE_BYTES:,}"}
            )
        content = upload.read()
        version, added = services.items_upload(
            name=data.validated_data["name"],
            rows=rows.read_file(content, upload.name or ""),
            filename=upload.name or "",
            content_sha256=hashlib.sha256(content).hexdigest(),
            description=data.validated_data["description"],
            actor=Actor.for_user(request.user),
            user=request.user,
        )
        return _added(version, added, [])

    @extend_schema(request=AddTasksInput, responses={201: AddedOutput, 400: REFUSED},
                   description="Add logged tasks (by id, or every usable task of a saved view) to the set: "
                   "each task's text and reference, or the newest reviewer's verdict on its answer.")  # fmt: skip
    @action(detail=True, methods=["post"], url_path="tasks", url_name="tasks")
    def add_tasks(self, request: Request, name: str | None = None, format: str | None = None) -> Response:
        data = AddTasksInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        how: dict[str, Any] = {}
        if "view" in values:
            view = visible_views(request.user).filter(pk=values["view"]).first()
            if view is None:
                raise NotFound("no such view")
            tasks, how = view_tasks(view), {"saved_view": view.pk, "view_name": view.name}
        else:
            found = Task.objects.in_bulk(values["tasks"])
            missing = [str(t) for t in values["tasks"] if t not in found]
            if missing:
                raise NotFound(f"no such task: {', '.join(missing[:5])}")
            tasks = [found[t] for t in values["tasks"]]
        version, added, skipped = services.tasks_add(
            name=str(name), tasks=tasks, kind=values["kind"], skip_unusable="view" in values,
            actor=Actor.for_user(request.user), user=request.user, how=how,
        )  # fmt: skip
        return _added(version, added, skipped)

    @extend_schema(
        responses={200: ItemOutput(many=True)},
        description="The items of a version (the latest by default; ?set_version=N).",
    )
    @action(detail=True, methods=["get"], url_path="items", url_name="items")
    def items(self, request: Request, name: str | None = None, format: str | None = None) -> Response:
        version = self._version(request, str(name))
        paginator = ItemPagination()
        page = paginator.paginate_queryset(version.items.all(), request, view=self)
        return paginator.get_paginated_response(ItemOutput(page, many=True).data)

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT}, description="The version's manifest: counts and content hash."
    )
    @action(detail=True, methods=["get"], url_path="manifest", url_name="manifest")
    def manifest(self, request: Request, name: str | None = None, format: str | None = None) -> Response:
        version = self._version(request, str(name))
        return Response(version.manifest if version.frozen else services.manifest_of(version))

    @extend_schema(responses={(200, "application/jsonl"): OpenApiTypes.BINARY, 404: OpenApiResponse(description="No such set")},
                   description="The version as JSON Lines: uploaded again, it gives the same content hash. Audited.")  # fmt: skip
    @action(detail=True, methods=["get"], url_path="export", url_name="export")
    def export(
        self, request: Request, name: str | None = None, format: str | None = None
    ) -> StreamingHttpResponse:
        return export_response(
            self._version(request, str(name)), Actor.for_user(request.user), what="api export"
        )
