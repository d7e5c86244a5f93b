"""Governance's scheduled work (Celery beat, settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from .retention import retention_purge as purge


@shared_task(name="governance.tasks.retention_purge")
def retention_purge() -> int:
    """Hourly: the content of tasks past their data class's retention, and their run chains."""
    return len(purge())
