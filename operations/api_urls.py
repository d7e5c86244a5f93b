"""The operators' API under /api/: tasks, workers, and runs side by side."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from operations.compare.api import RunCompareView
from operations.pool.api import WorkerViewSet
from operations.tasks.api import TaskViewSet

router = DefaultRouter()
router.register("tasks", TaskViewSet, basename="task")
router.register("workers", WorkerViewSet, basename="worker")

urlpatterns = [
    path("runs/compare/", RunCompareView.as_view(), name="run-compare"),
    *router.urls,
]
