from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from audit import policies, verify

        from . import (
            holds,  # noqa: F401 (its receiver keeps a task under legal hold from being deleted)
            providers,
            record_check,
            saved_view_check,
            task_check,
            telemetry,
        )
        from .models import DataClass, Worker
        from .signals import run_finished

        providers.register_litellm_providers()
        # What a policy rule may name (audit sits below routing, so routing tells it): the vendors and
        # regions of the registered workers, disabled ones included, and the data classes.
        policies.vocabulary_register(
            vendors=lambda: Worker.objects.values_list("vendor", flat=True).distinct(),
            regions=lambda: Worker.objects.exclude(region="").values_list("region", flat=True).distinct(),
            data_classes=lambda: DataClass.values,
        )
        # Verification compares the run rows with the events that describe them.
        verify.row_check_register(record_check.run_rows_problems)
        verify.row_check_register(task_check.task_rows_problems)
        verify.row_check_register(saved_view_check.saved_view_problems)
        # A finished run becomes an OpenTelemetry trace when an OTLP endpoint is set.
        run_finished.connect(telemetry.on_run_finished, dispatch_uid="routing.telemetry")
