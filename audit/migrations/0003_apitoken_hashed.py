"""API tokens: keep a hash, not the token. Existing plaintext keys become their sha256 and a prefix;
the plaintext column goes in 0004. Tokens made before had no expiry: they get the default lifetime
(API_TOKEN_DEFAULT_DAYS) from now, so that clients using them keep working until then."""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

PREFIX_CHARS = 10  # audit.grants.TOKEN_PREFIX_CHARS when this was written


def hash_keys(apps, schema_editor):
    ApiToken = apps.get_model("audit", "ApiToken")
    expires = timezone.now() + timedelta(days=getattr(settings, "API_TOKEN_DEFAULT_DAYS", 90))
    for token in ApiToken.objects.using(schema_editor.connection.alias).only("pk", "key"):
        token.key_hash = hashlib.sha256(token.key.encode()).hexdigest()
        token.prefix = token.key[:PREFIX_CHARS]
        token.expires_at = expires
        token.save(update_fields=["key_hash", "prefix", "expires_at"])


def unhash_keys(apps, schema_editor):
    # The tokens cannot be recovered from their hashes: going back leaves every token revoked.
    ApiToken = apps.get_model("audit", "ApiToken")
    now = timezone.now()
    for token in ApiToken.objects.using(schema_editor.connection.alias).all():
        token.key = token.key_hash
        token.revoked_at = token.revoked_at or now
        token.save(update_fields=["key", "revoked_at"])


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_triggers")]

    operations = [
        migrations.AlterModelOptions(name="apitoken", options={"ordering": ["-created_at", "-id"]}),
        migrations.AlterField(
            model_name="apitoken", name="key", field=models.CharField(max_length=64, null=True)
        ),
        migrations.AddField(
            model_name="apitoken",
            name="key_hash",
            field=models.CharField(max_length=64, null=True, help_text="sha256 of the token, hex"),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="prefix",
            field=models.CharField(
                max_length=16, default="", help_text="The token's first characters (not secret)"
            ),
            preserve_default=False,
        ),
        migrations.AddField(model_name="apitoken", name="expires_at", field=models.DateTimeField(null=True)),
        migrations.AddField(
            model_name="apitoken",
            name="last_used_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_by",
            field=models.CharField(
                blank=True, max_length=150, default="", help_text="Copied so it outlives the account"
            ),
            preserve_default=False,
        ),
        migrations.RunPython(hash_keys, unhash_keys),
    ]
