"""The app's database role, locked down, can append to the audit record but not change it."""

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from audit.models import AuditEvent
from audit.services import Actor, event_record
from routing.services import conductor_active


@pytest.mark.django_db
def test_a_locked_down_role_may_insert_but_not_update_delete_or_truncate_audit_rows():
    with transaction.atomic():
        event_record(actor=Actor.service("test"), action="audit.exported", obj=conductor_active())
    event_id = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
    with connection.cursor() as cursor:
        cursor.execute("CREATE ROLE conductor_app_test NOLOGIN")
        cursor.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO conductor_app_test")
    call_command("audit_lock_down", "conductor_app_test")
    with connection.cursor() as cursor:
        cursor.execute("SET ROLE conductor_app_test")
        try:
            cursor.execute("SELECT count(*) FROM audit_auditevent")
            assert cursor.fetchone()[0] >= 1
            for statement in (
                "UPDATE audit_auditevent SET action = 'x' WHERE id = %s",
                "DELETE FROM audit_auditevent WHERE id = %s",
                "TRUNCATE audit_auditevent",
            ):
                with pytest.raises(DatabaseError, match="permission denied"), transaction.atomic():
                    cursor.execute(statement, [event_id] if "%s" in statement else None)
        finally:
            cursor.execute("RESET ROLE")
