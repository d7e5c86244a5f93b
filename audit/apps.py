from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from . import auth_events, grants_check, user_events, verify

        auth_events.connect()
        user_events.connect()
        # Verification compares who holds which role with the events that granted it.
        verify.row_check_register(grants_check.grants_problems)
