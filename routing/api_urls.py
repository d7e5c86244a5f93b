"""The routing API's router."""

from rest_framework.routers import DefaultRouter

from .api import TaskViewSet, WorkerViewSet

router = DefaultRouter()
router.register("tasks", TaskViewSet, basename="task")
router.register("workers", WorkerViewSet, basename="worker")

urlpatterns = router.urls
