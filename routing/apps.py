from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"

    def ready(self) -> None:
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
