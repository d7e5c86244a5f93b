"""API tokens: the plaintext column goes; the hash is required and unique, and so is an expiry."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_apitoken_hashed")]

    operations = [
        migrations.RemoveField(model_name="apitoken", name="key"),
        migrations.AlterField(
            model_name="apitoken",
            name="key_hash",
            field=models.CharField(max_length=64, unique=True, help_text="sha256 of the token, hex"),
        ),
        migrations.AlterField(model_name="apitoken", name="expires_at", field=models.DateTimeField()),
    ]
