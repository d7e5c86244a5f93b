"""Admin for what changes the rules: every save is an audit event in the same transaction."""

from django.contrib import admin
from django.db import transaction

from .models import LegalHold, PolicyRule
from .services import Actor, event_record


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


@admin.register(PolicyRule)
class PolicyRuleAdmin(AuditedAdmin):
    list_display = ["name", "kind", "data_classes", "vendors", "regions", "enabled"]
    list_filter = ["kind", "enabled"]


@admin.register(LegalHold)
class LegalHoldAdmin(admin.ModelAdmin):
    list_display = ["task", "reason", "placed_by", "placed_at", "released_at"]

    def has_add_permission(self, request):
        return False  # placed and released from the task's dossier, where it is audited

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
