"""Audit's pages of the admin site by role (accounts.admin.site): every save is an audit event in
the same transaction.

- AuditedAdmin, the ModelAdmin of the models whose changes are recorded (policy rules here, workers
  and conductor versions in routing/admin.py).
- Users and groups (their names are roles) are the admin role's; their changes are audited by
  audit.user_events, from here or anywhere else. API tokens are listed and revoked here (made on
  /audit/tokens/, where the token is shown once).

docs/audit.md ("Who reaches which admin page") lists the result; tests/accounts/test_admin_roles.py
checks it page by page.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils.html import escape

from accounts.admin import AUDITOR, RoleModelAdmin, request_context_register, site
from accounts.models import ApiToken
from accounts.roles import has_role, user_roles
from audit.grants import token_revoke

from . import policies, user_events
from .actions import Action
from .models import LegalHold, PolicyRule
from .services import Actor, event_record


def acting_as_signed_in(request):
    """The admin site's changes to users and groups are recorded with the signed-in user as actor."""
    return user_events.acting_as(Actor.for_user(request.user))


request_context_register(acting_as_signed_in)


class AuditedAdmin(RoleModelAdmin):
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
            sensitive = [f for f in form.changed_data if f in self.admin_only_fields]
            if change and sensitive:  # where data and which key go: its own event, with what it was
                event_record(
                    actor=Actor.for_user(request.user),
                    action=f"{model}.endpoint_changed",
                    obj=obj,
                    payload={
                        "via": "admin",
                        **{
                            f: {"from": form.initial.get(f), "to": form.cleaned_data.get(f)}
                            for f in sensitive
                        },
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
            if field not in self.fields:
                continue  # read-only (a role that may only view)
            base = self.fields[field].help_text
            self.fields[field].help_text = (
                # The admin renders help text as HTML: the workers' vendors and regions are escaped.
                f"{base + '. ' if base else ''}Comma-separated; known: {escape(policies.listed(field, known))}"
            )
        if "name" in self.fields:
            self.fields[
                "name"
            ].help_text = "A slug: letters, digits, hyphens and underscores, no spaces (e.g. no-openai)"

    def clean(self):
        data = super().clean()
        for field in self.LISTS:
            if data.get(field) is not None:
                data[field] = policies.normalise_all(data[field])
        return data


@admin.register(PolicyRule, site=site)
class PolicyRuleAdmin(AuditedAdmin):
    roles = {"view": (AUDITOR,)}
    form = PolicyRuleForm
    list_display = ["name", "kind", "data_classes", "vendors", "regions", "enabled"]
    list_filter = ["kind", "enabled"]

    def save_model(self, request, obj, form, change):
        """Stored with its event by the one service that saves rules (audit.policies.policy_rule_save)."""
        if change and not form.changed_data:
            return
        policies.policy_rule_save(rule=obj, actor=Actor.for_user(request.user), via="admin")


@admin.register(LegalHold, site=site)
class LegalHoldAdmin(RoleModelAdmin):
    roles = {"view": (AUDITOR,)}
    list_display = ["task_id", "reason", "placed_by", "placed_at", "released_at"]

    def has_add_permission(self, request):
        return False  # placed and released from the task's dossier, where it is audited

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# --- API tokens ----------------------------------------------------------------------------------


@admin.register(ApiToken, site=site)
class ApiTokenAdmin(RoleModelAdmin):
    """Every user's tokens (the admin role's): listed and revoked here, made on /audit/tokens/."""

    roles = {"view": ()}  # the admin role only
    list_display = [
        "prefix_shown",
        "name",
        "user",
        "role",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["role", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    fields = [*list_display, "revoked_by"]
    readonly_fields = fields
    actions = ["revoke"]

    @admin.display(description="token", ordering="prefix")
    def prefix_shown(self, token: ApiToken) -> str:
        return f"{token.prefix}…"

    def has_add_permission(self, request):
        return False  # made on /audit/tokens/, where the token is shown once

    def has_change_permission(self, request, obj=None):
        return False  # nothing to edit; revoking is the action below

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the record refers to it

    def has_revoke_permission(self, request) -> bool:
        return has_role(request, ())

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        actor = Actor.for_user(request.user)
        revoked = sum(token_revoke(token=token, actor=actor) for token in queryset)
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)


# --- Users and groups (a group's name is a role) -------------------------------------------------

ROLE_HELP = (
    "A user's roles are its groups named auditor, operator, ml_staff, admin; a superuser is an admin. "
    "Staff status and Django permissions grant nothing here. Every change is an audit event."
)


@admin.register(get_user_model(), site=site)
class UserAdmin(RoleModelAdmin, DjangoUserAdmin):
    roles = {"view": (), "add": (), "change": ()}  # the admin role only
    fieldsets = (
        (None, {"fields": ("username", "password")}),
        ("Personal info", {"fields": ("first_name", "last_name", "email")}),
        ("Access", {"fields": ("is_active", "is_superuser", "groups"), "description": ROLE_HELP}),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    readonly_fields = ["last_login", "date_joined"]
    list_display = ["username", "email", "role_names", "is_active", "is_superuser"]
    list_filter = ["is_active", "is_superuser", "groups"]
    filter_horizontal = ["groups"]

    @admin.display(description="roles")
    def role_names(self, user) -> str:

        return ", ".join(sorted(user_roles(user))) or "—"

    def has_delete_permission(self, request, obj=None):
        return False  # deactivate instead (is_active): the record refers to its actions

    def save_model(self, request, obj, form, change):
        # Groups and flags are audited by audit.user_events (acting as this user); other fields here,
        # by name only (never a password or its hash).
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            other = [
                f
                for f in form.changed_data
                if f not in ("groups", *user_events.FLAGS) and "password" not in f
            ]
            if change and other:
                event_record(
                    actor=Actor.for_user(request.user),
                    action=Action.USER_UPDATED,
                    obj=obj,
                    payload={"via": "admin", "username": obj.get_username(), "changed": sorted(other)},
                )


@admin.register(Group, site=site)
class GroupAdmin(RoleModelAdmin, DjangoGroupAdmin):
    """Groups are roles by name; creating and renaming them is audited by audit.user_events."""

    roles = {"view": (), "add": (), "change": ()}  # the admin role only
    fields = ["name"]
    filter_horizontal = []
    list_display = ["name"]

    def has_delete_permission(self, request, obj=None):
        return False  # take its members out instead, one audited change each
