from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """The operators' pages and read models: tasks, the live graph, the pool, the overview, analytics,
    runs side by side, saved views. Its URL names keep the `routing:` namespace they were made under."""

    name = "operations"
    verbose_name = "Operations"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from audit import verify

        from .saved_views import row_check

        verify.row_check_register(row_check.saved_view_problems)
