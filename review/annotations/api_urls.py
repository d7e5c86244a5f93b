"""The review API's routes, under /api/."""

from rest_framework.routers import SimpleRouter

from review.annotations.api import AnnotationViewSet

router = SimpleRouter()
router.register("annotations", AnnotationViewSet, basename="annotation")

urlpatterns = router.urls
