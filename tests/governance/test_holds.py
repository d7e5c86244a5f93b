"""Legal holds keep a task's id, not a foreign key (audit knows nothing of routing): routing refuses to
delete a held task, and databases made while the foreign key existed lose its constraint in 0006."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.deletion import ProtectedError

from audit.models import LegalHold
from audit.services import Actor, legal_hold_place, legal_hold_release
from routing.models import Task
from routing.services import TaskSubmission, task_submit


def submit() -> Task:
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    return task


@pytest.mark.django_db
def test_a_task_under_legal_hold_cannot_be_deleted_until_released():
    task = submit()
    task_id = task.pk
    counsel = Actor.service("legal")
    legal_hold_place(task=task, actor=counsel, reason="litigation")
    with pytest.raises(ProtectedError):
        task.delete()
    assert Task.objects.filter(pk=task.pk).exists()
    legal_hold_release(task=task, actor=counsel)
    task.runs.all().delete()
    task.delete()
    assert not Task.objects.filter(pk=task_id).exists()
    assert LegalHold.objects.filter(task_id=task_id).count() == 1  # the record of the hold stays


def foreign_keys() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'audit_legalhold'::regclass AND contype = 'f'"
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_migration_0006_drops_the_foreign_key_a_database_made_before_it_carries():
    assert foreign_keys() == []
    call_command("migrate", "audit", "0005", verbosity=0)
    with connection.cursor() as cursor:  # as 0001 made it before it said "a task id"
        cursor.execute(
            "ALTER TABLE audit_legalhold ADD CONSTRAINT audit_legalhold_task_id_fk_routing_task_id "
            "FOREIGN KEY (task_id) REFERENCES routing_task (id) DEFERRABLE INITIALLY DEFERRED"
        )
    assert foreign_keys() == ["audit_legalhold_task_id_fk_routing_task_id"]
    call_command("migrate", verbosity=0)  # every app: those that depend on audit's migrations come back too
    assert foreign_keys() == []
