"""Periodic audit work (beat): signed checkpoints, and the pending seals of ended runs. Thin: they call
the services."""

from celery import shared_task

from .checkpoints import checkpoint_create as create
from .seals import seal_pending as seal


@shared_task(name="audit.tasks.checkpoint_create")
def checkpoint_create() -> int | None:
    """Every few seconds: a checkpoint when any chain moved, none when idle."""

    checkpoint = create(only_if_moved=True)
    return checkpoint.pk if checkpoint else None


@shared_task(name="audit.tasks.seal_pending")
def seal_pending() -> int:
    """About every second (AUDIT_SEAL_EVERY_S): the pending seals of ended runs appended to the global
    chain, a batch at a time; how many."""

    return seal()
