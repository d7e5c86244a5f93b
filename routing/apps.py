from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"

    def ready(self) -> None:
        from . import providers

        providers.register_litellm_providers()
