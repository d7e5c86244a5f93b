"""Admin for what changes the rules: every save is an audit event in the same transaction."""

from django import forms
from django.contrib import admin
from django.db import transaction

from . import policies
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


class PolicyRuleForm(forms.ModelForm):
    """Values are checked by PolicyRule.clean() (audit.policies.rule_values_check, against the values
    routing registers); the form lists those values and records the normalised ones."""

    LISTS = ("vendors", "regions", "data_classes")

    class Meta:
        model = PolicyRule
        fields = ["name", "kind", "data_classes", "vendors", "regions", "description", "enabled"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        known = policies.known_values()
        for field in self.LISTS:
            listed = ", ".join(known[field]) or "none yet (no worker is registered)"
            base = self.fields[field].help_text
            self.fields[field].help_text = f"{base + '. ' if base else ''}Comma-separated; known: {listed}"

    def clean(self):
        data = super().clean()
        for field in self.LISTS:
            if data.get(field) is not None:
                data[field] = policies.normalise_all(data[field])
        return data


@admin.register(PolicyRule)
class PolicyRuleAdmin(AuditedAdmin):
    form = PolicyRuleForm
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
