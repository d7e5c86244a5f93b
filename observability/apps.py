from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Runs as OpenTelemetry traces and the record's figures on /metrics."""

    name = "observability"
    verbose_name = "Observability"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from routing.signals import run_finished

        from . import telemetry

        # A finished run becomes an OpenTelemetry trace when an OTLP endpoint is set.
        run_finished.connect(telemetry.on_run_finished, dispatch_uid="observability.telemetry")
