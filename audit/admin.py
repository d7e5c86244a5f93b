"""The admin site, by role: who reaches which page is decided by our roles (audit.roles), never by
`is_staff` or Django's model permissions. Every save is an audit event in the same transaction.

- `site` (RoleAdminSite) lets in users holding a role; everyone else signed in gets 403, and signing
  in goes through the app's own login page.
- Each ModelAdmin (RoleModelAdmin) declares which roles may view, add, change and delete its model
  (`roles`); the admin role may do whatever the ModelAdmin allows at all. Fields only the admin role
  may change (`admin_only_fields`) are read-only for everyone else.
- Users and groups (their names are roles) are the admin role's; their changes are audited by
  audit.user_events, from here or anywhere else. API tokens are listed and revoked here (made on
  /audit/tokens/, where the token is shown once).

docs/audit.md ("Who reaches which admin page") lists the result; tests/audit/test_admin_roles.py
checks it page by page.
"""

from functools import wraps

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth import REDIRECT_FIELD_NAME, get_user_model
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.shortcuts import resolve_url
from django.urls import reverse
from django.utils.html import escape
from django.utils.http import url_has_allowed_host_and_scheme

from . import policies, user_events
from .actions import Action
from .models import ApiToken, LegalHold, PolicyRule, Role
from .roles import has_role, request_roles, token_revoke, user_roles
from .services import Actor, event_record

AUDITOR, OPERATOR, ML_STAFF, ADMIN = Role.AUDITOR, Role.OPERATOR, Role.ML_STAFF, Role.ADMIN


class RoleAdminSite(admin.AdminSite):
    site_header = "Conductor Web administration"
    site_title = "Conductor Web admin"
    index_title = "Administration"

    def has_permission(self, request) -> bool:
        # Any role reaches the index; each page then asks its ModelAdmin. Not is_staff.
        return bool(request.user.is_active and request_roles(request))

    def admin_view(self, view, cacheable=False):
        protected = super().admin_view(view, cacheable)

        @wraps(protected)
        def inner(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path(), resolve_url(settings.LOGIN_URL))
            if not self.has_permission(request) and request.path != reverse(
                "admin:logout", current_app=self.name
            ):
                raise PermissionDenied("the admin site needs a role")
            # Changes to users and groups made here are recorded with this user as their actor.
            with user_events.acting_as(Actor.for_user(request.user)):
                return protected(request, *args, **kwargs)

        return inner

    def login(self, request, extra_context=None):
        """One login page for the whole app (/login/): the admin site has no staff login of its own."""
        target = request.GET.get(REDIRECT_FIELD_NAME, "")
        if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
            target = reverse("admin:index", current_app=self.name)
        return redirect_to_login(target, resolve_url(settings.LOGIN_URL))


site = RoleAdminSite(name="admin")


class RoleModelAdmin(admin.ModelAdmin):
    """A ModelAdmin whose permissions are roles. `roles` maps "view", "add", "change", "delete" to the
    roles that may (the admin role always may, where the ModelAdmin allows it at all); change implies
    view. `admin_only_fields` are read-only unless the request holds the admin role."""

    roles: dict[str, tuple[str, ...]] = {}
    admin_only_fields: tuple[str, ...] = ()

    def _may(self, request, action: str) -> bool:
        return has_role(request, self.roles.get(action, ()))

    def has_view_permission(self, request, obj=None) -> bool:
        return self._may(request, "view") or self._may(request, "change")

    def has_add_permission(self, request) -> bool:
        return self._may(request, "add")

    def has_change_permission(self, request, obj=None) -> bool:
        return self._may(request, "change")

    def has_delete_permission(self, request, obj=None) -> bool:
        return self._may(request, "delete")

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if ADMIN not in request_roles(request):
            fields += [f for f in self.admin_only_fields if f not in fields]
        return fields


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
