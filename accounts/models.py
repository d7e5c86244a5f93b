"""Roles and the API tokens that carry one."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Role(models.TextChoices):
    AUDITOR = "auditor", "Auditor"
    OPERATOR = "operator", "Operator"
    ML_STAFF = "ml_staff", "ML staff"
    ADMIN = "admin", "Admin"


class ApiToken(models.Model):
    """An API token that carries a role (at most the roles its user has).

    The token itself is never stored: only its sha256 (tokens are 256 random bits, not passwords, so
    a fast hash is right) and its first characters (`prefix`, not secret) to tell tokens apart. It is
    shown once, when made (audit.grants.token_create, which records it). It expires, and may be
    revoked. Its table keeps the name it was created with, audit_apitoken."""

    key_hash = models.CharField(max_length=64, unique=True, help_text="sha256 of the token, hex")
    prefix = models.CharField(max_length=16, help_text="The token's first characters (not secret)")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="api_tokens", on_delete=models.CASCADE)
    role = models.CharField(max_length=20, choices=Role.choices)
    name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True, help_text="Copied so it outlives the account")

    class Meta:
        db_table = "audit_apitoken"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"token {self.name or self.pk} ({self.role}) of {self.user}"

    @property
    def is_expired(self) -> bool:
        return self.expires_at <= timezone.now()

    @property
    def is_usable(self) -> bool:
        return self.revoked_at is None and not self.is_expired
