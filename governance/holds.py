"""Legal holds on tasks: a task under an active hold is kept whole, by retention's purge and by any
delete. The hold itself is audit's row (LegalHold keeps the task's id, not a foreign key, so that the
record knows nothing of routing); what it protects is routing's, so the protection lives here."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.db.models.deletion import ProtectedError
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from audit.models import LegalHold
from routing.models import Task


def holds_active(task_id: Any) -> QuerySet[LegalHold]:
    return LegalHold.objects.filter(task_id=task_id, released_at__isnull=True)


@receiver(pre_delete, sender=Task, dispatch_uid="governance.holds.task_held")
def _refuse_deleting_a_held_task(sender: Any, instance: Task, **kwargs: Any) -> None:
    """A task under legal hold is never deleted (LegalHold keeps the task's id, not a foreign key)."""
    if holds_active(instance.pk).exists():
        raise ProtectedError(f"task {instance.pk} is under legal hold", {instance})
