from django.apps import AppConfig


class RoutingConfig(AppConfig):
    """The engine: a run's life and its rows (no pages)."""

    name = "routing"
    verbose_name = "Routing"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from audit import policies

        from . import providers
        from .models import DataClass, Worker

        providers.register_litellm_providers()
        # What a policy rule may name (audit sits below routing, so routing tells it): the vendors and
        # regions of the registered workers, disabled ones included, and the data classes.
        policies.vocabulary_register(
            vendors=lambda: Worker.objects.values_list("vendor", flat=True).distinct(),
            regions=lambda: Worker.objects.exclude(region="").values_list("region", flat=True).distinct(),
            data_classes=lambda: DataClass.values,
        )
