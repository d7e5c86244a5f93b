"""The event table's two indexes of `action` alone (a plain one and a prefix one) dropped: one index
of (action, newest first) in the pattern operator class serves an action's events, its prefix and
their order, and every event maintains two indexes fewer."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0007_policy_events_index'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='auditevent',
            name='audit_action_id',
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='action',
            field=models.CharField(max_length=60),
        ),
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(fields=['action', '-id'], name='audit_action_id', opclasses=['varchar_pattern_ops', 'int8_ops']),
        ),
    ]
