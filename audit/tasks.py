"""Periodic audit work (beat): signed checkpoints. Thin: it calls the service."""

from celery import shared_task

from .checkpoints import checkpoint_create as create


@shared_task(name="audit.tasks.checkpoint_create")
def checkpoint_create() -> int | None:
    """Every few seconds: a checkpoint when any chain moved, none when idle."""

    checkpoint = create(only_if_moved=True)
    return checkpoint.pk if checkpoint else None
