from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        # load order: models import only once Django's app registry is ready (AppConfig.ready)
        from accounts.authentication import token_record_check_register

        from . import auth_events, grants_check, token_check, user_events, verify

        auth_events.connect()
        user_events.connect()
        # Verification compares who holds which role with the events that granted it.
        verify.row_check_register(grants_check.grants_problems)
        # A token authenticates only as its events recorded it; verification names those that differ.
        token_record_check_register(token_check.token_refusal)
        verify.row_check_register(token_check.token_rows_problems)
