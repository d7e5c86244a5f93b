from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from routing.conductors import backend_register
        from routing.models import ConductorVersion
        from routing.services import key_prefix_reserve

        from . import receivers  # noqa: F401 (connects them)
        from .conductor import LearnedConductor
        from .services import TRAINING_KEY_PREFIX

        backend_register(ConductorVersion.Backend.LEARNED, LearnedConductor)
        key_prefix_reserve(TRAINING_KEY_PREFIX, "training items")
