from django.apps import AppConfig


class ConductorWebConfig(AppConfig):
    name = "conductor_web"

    def ready(self) -> None:
        # A conductor trained on the local model is served by the local model's server (llama.cpp):
        # training asks for it by the version's config["serving"], without importing this app.
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from training.services import adapter_server_register

        from .local_model import adapter_load

        adapter_server_register("llama.cpp", adapter_load)
