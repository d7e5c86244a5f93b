"""The admin site, by role: who reaches which page is decided by our roles (accounts.roles), never by
`is_staff` or Django's model permissions.

- `site` (RoleAdminSite) lets in users holding a role; everyone else signed in gets 403, and signing
  in goes through the app's own login page.
- Each ModelAdmin (RoleModelAdmin) declares which roles may view, add, change and delete its model
  (`roles`); the admin role may do whatever the ModelAdmin allows at all. Fields only the admin role
  may change (`admin_only_fields`) are read-only for everyone else.

The apps register their own models here (audit/admin.py, routing/admin.py), as with Django's own
site; this module knows none of them. Every view of the site runs inside the contexts registered
with `request_context_register`: audit's names the signed-in user as the actor of the changes it
records.

docs/audit.md ("Who reaches which admin page") lists the result; tests/accounts/test_admin_roles.py
checks it page by page.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import resolve_url
from django.urls import re_path, reverse
from django.utils.http import url_has_allowed_host_and_scheme

from .models import Role
from .roles import has_role, request_roles

AUDITOR, OPERATOR, ML_STAFF, ADMIN = Role.AUDITOR, Role.OPERATOR, Role.ML_STAFF, Role.ADMIN

# Models that moved from one app to another, by their admin pages' old and new places under the site:
# links and bookmarks to the old pages still land.
MOVED = {"audit/apitoken/": "accounts/apitoken/"}

RequestContext = Callable[[Any], AbstractContextManager[Any]]
_request_contexts: list[RequestContext] = []


def request_context_register(context: RequestContext) -> None:
    """Run every view of the admin site inside `context(request)` (entered for a signed-in user with
    a role, in the order registered)."""
    if context not in _request_contexts:
        _request_contexts.append(context)


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
            with ExitStack() as stack:
                for context in _request_contexts:
                    stack.enter_context(context(request))
                return protected(request, *args, **kwargs)

        return inner

    def get_urls(self):
        return [
            re_path(rf"^{old}(?P<rest>.*)$", self._moved_view(new)) for old, new in MOVED.items()
        ] + super().get_urls()

    def _moved_view(self, new: str):
        def moved(request, rest: str):
            query = request.META.get("QUERY_STRING", "")
            target = reverse("admin:index", current_app=self.name) + new + rest
            return HttpResponseRedirect(f"{target}?{query}" if query else target)

        return moved

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
