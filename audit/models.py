"""The audit record: one row per decision or action, written in the same transaction as the change."""

from __future__ import annotations

from django.db import models


class AuditEvent(models.Model):
    class ActorType(models.TextChoices):
        USER = "user", "User"
        SERVICE = "service", "Service"

    occurred_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_type = models.CharField(max_length=10, choices=ActorType.choices)
    actor_id = models.CharField(max_length=100, blank=True)
    actor_name = models.CharField(max_length=150, help_text="Copied so the record outlives the account")
    action = models.CharField(max_length=60, db_index=True)
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=100)
    task_id = models.UUIDField(null=True, blank=True, db_index=True)
    correlation_id = models.UUIDField(null=True, blank=True, db_index=True)
    payload = models.JSONField(default=dict)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["object_type", "object_id"], name="audit_object")]

    def __str__(self) -> str:
        return f"{self.action} {self.object_type}:{self.object_id}"
