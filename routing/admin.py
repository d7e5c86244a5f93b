"""Admin for the pool and conductor versions. Every save is an audit event in the same transaction."""

from django.contrib import admin
from django.db import transaction

from audit.services import Actor, event_record

from .models import ConductorVersion, Worker


class AuditedAdmin(admin.ModelAdmin):
    def save_model(self, request, obj, form, change):
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if change and not form.changed_data:
                return
            model = obj._meta.model_name
            event_record(
                actor=Actor.for_user(request.user),
                action=f"{model}.{'updated' if change else 'registered'}",
                obj=obj,
                payload={
                    "via": "admin",
                    "changed": {f: str(form.cleaned_data.get(f)) for f in form.changed_data},
                },
            )

    def has_delete_permission(self, request, obj=None):
        return False  # the record refers to them; disable instead


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
