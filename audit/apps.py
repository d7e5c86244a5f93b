from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from . import auth_events, user_events

        auth_events.connect()
        user_events.connect()
