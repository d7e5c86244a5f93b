from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training"

    def ready(self) -> None:
        from routing.conductors import backend_register
        from routing.models import ConductorVersion

        from .conductor import LearnedConductor

        backend_register(ConductorVersion.Backend.LEARNED, LearnedConductor)
