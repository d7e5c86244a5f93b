"""The API's worker endpoints: the pool as the engine sees it."""

from __future__ import annotations

from rest_framework import mixins, viewsets

from accounts.roles import EVERYONE
from operations.tasks.serializers import (
    WorkerOutput,
)
from routing import selectors


class WorkerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    required_roles = {"GET": EVERYONE}
    serializer_class = WorkerOutput
    lookup_field = "slug"
    pagination_class = None

    def get_queryset(self):
        return selectors.worker_list()
