from django.core.management.base import BaseCommand, CommandError
from django.db import connection

AUDIT_TABLES = ["audit_auditevent", "audit_checkpoint", "audit_chainpurge"]


class Command(BaseCommand):
    help = (
        "Take UPDATE, DELETE and TRUNCATE on the audit tables away from the app's database role (run as the "
        "tables' owner). With the triggers this makes the audit record append-only twice over."
    )

    def add_arguments(self, parser):
        parser.add_argument("role", help="the database role the app connects as")

    def handle(self, *args, **options):
        role = options["role"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone() is None:
                raise CommandError(f"no database role {role!r}")
            quoted = connection.ops.quote_name(role)
            for table in AUDIT_TABLES:
                cursor.execute(f"REVOKE UPDATE, DELETE, TRUNCATE ON {table} FROM {quoted}")
                cursor.execute(f"GRANT SELECT, INSERT ON {table} TO {quoted}")
        self.stdout.write(f"{role}: SELECT and INSERT only on {', '.join(AUDIT_TABLES)}")
