"""The routing API's router, and the run comparison beside it."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from .api import RunCompareView, TaskViewSet, WorkerViewSet

router = DefaultRouter()
router.register("tasks", TaskViewSet, basename="task")
router.register("workers", WorkerViewSet, basename="worker")

urlpatterns = [
    path("runs/compare/", RunCompareView.as_view(), name="run-compare"),
    *router.urls,
]
