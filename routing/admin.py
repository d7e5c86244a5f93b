"""Admin for the pool and conductor versions. Every save is an audit event in the same transaction.

Operators manage workers (view, change); auditors and ML staff see them or the conductor versions
(see accounts.admin, audit.admin and docs/audit.md). Where a worker sends data and which key it sends (`api_base`,
`api_key_env`), and a conductor version's `config` (its endpoint and key), are changed by the admin
role only: read-only for everyone else."""

from django.contrib import admin

from accounts.admin import ADMIN, AUDITOR, ML_STAFF, OPERATOR, site
from audit.admin import AuditedAdmin

from .models import ConductorVersion, Worker
from .secrets import ENDPOINT_FIELDS


@admin.register(Worker, site=site)
class WorkerAdmin(AuditedAdmin):
    roles = {"view": (AUDITOR,), "change": (OPERATOR,), "add": (ADMIN,)}
    admin_only_fields = ENDPOINT_FIELDS  # api_base, api_key_env
    list_display = [
        "slug",
        "litellm_model",
        "vendor",
        "input_usd_per_mtok",
        "output_usd_per_mtok",
        "price_source",
        "enabled",
    ]
    list_filter = ["vendor", "enabled", "self_hosted"]
    search_fields = ["slug", "litellm_model"]


@admin.register(ConductorVersion, site=site)
class ConductorVersionAdmin(AuditedAdmin):
    roles = {"view": (AUDITOR, OPERATOR, ML_STAFF), "add": (ADMIN,), "change": (ADMIN,)}
    admin_only_fields = ("config",)
    list_display = ["name", "backend", "is_active", "created_at"]
    readonly_fields = ["is_active"]  # activation goes through routing.services.conductor_activate
