"""The training API's router."""

from rest_framework import routers

from .api import READERS, ConductorViewSet, DatasetViewSet, EvaluationViewSet, JobViewSet, RolloutBatchViewSet
from .itemsets.api import ItemSetViewSet

app_name = "training-api"


class TrainingRootView(routers.APIRootView):
    """The training API's endpoints (for the roles that may read them)."""

    required_roles = {"GET": READERS, "HEAD": READERS, "OPTIONS": READERS}


class TrainingRouter(routers.DefaultRouter):
    APIRootView = TrainingRootView


router = TrainingRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("rollouts", RolloutBatchViewSet, basename="rollout")
router.register("evaluations", EvaluationViewSet, basename="evaluation")
router.register("conductors", ConductorViewSet, basename="conductor")
router.register("itemsets", ItemSetViewSet, basename="itemset")

urlpatterns = router.urls
