from django.apps import AppConfig


class GovernanceConfig(AppConfig):
    """Governance beside the record: retention, legal holds, and the row checks the verifier runs."""

    name = "governance"
    verbose_name = "Governance"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from audit import verify

        from . import (
            holds,  # noqa: F401 (its receiver keeps a task under legal hold from being deleted)
            run_rows,
            task_rows,
        )

        # Verification compares the run and task rows with the events that describe them.
        verify.row_check_register(run_rows.run_rows_problems)
        verify.row_check_register(task_rows.task_rows_problems)
