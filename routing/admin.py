"""Admin for the pool and conductor versions. Every save is an audit event in the same transaction."""

from django.contrib import admin

from audit.admin import AuditedAdmin

from .models import ConductorVersion, Worker


@admin.register(Worker)
class WorkerAdmin(AuditedAdmin):
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


@admin.register(ConductorVersion)
class ConductorVersionAdmin(AuditedAdmin):
    list_display = ["name", "backend", "is_active", "created_at"]
    readonly_fields = ["is_active"]  # activation goes through routing.services.conductor_activate
