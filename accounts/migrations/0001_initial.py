"""ApiToken comes over from audit with its table (audit_apitoken, kept by name): this migration only
tells Django's model state where it now lives; audit's 0012 takes it out of audit's state. The
database is not changed, but for the admin's content type of the model, renamed to this app so the
admin's history of tokens follows them."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def content_type_rename(app_from: str, app_to: str):
    def rename(apps, schema_editor):
        content_types = apps.get_model("contenttypes", "ContentType").objects.using(
            schema_editor.connection.alias
        )
        if not content_types.filter(app_label=app_to, model="apitoken").exists():
            content_types.filter(app_label=app_from, model="apitoken").update(app_label=app_to)

    return rename


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("contenttypes", "0002_remove_content_type_name"),
        ("audit", "0011_table_stamps"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("key_hash", models.CharField(help_text="sha256 of the token, hex", max_length=64, unique=True)),
                        ("prefix", models.CharField(help_text="The token's first characters (not secret)", max_length=16)),
                        ("role", models.CharField(choices=[("auditor", "Auditor"), ("operator", "Operator"), ("ml_staff", "ML staff"), ("admin", "Admin")], max_length=20)),
                        ("name", models.CharField(blank=True, max_length=100)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("expires_at", models.DateTimeField()),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        ("revoked_by", models.CharField(blank=True, help_text="Copied so it outlives the account", max_length=150)),
                        ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="api_tokens", to=settings.AUTH_USER_MODEL)),
                    ],
                    options={"db_table": "audit_apitoken", "ordering": ["-created_at", "-id"]},
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_type_rename("audit", "accounts"), content_type_rename("accounts", "audit")),
    ]
