"""Who may do what, audited wherever it changes: the admin site, `manage.py shell`, `createsuperuser`,
`grant_role`, or code. Signal handlers write an audit event for

- a user's groups (its roles): `user.groups_changed`, with the groups added and removed (also when
  changed from the group's side, `group.user_set`, and on `clear()`);
- its `is_active`, `is_staff`, `is_superuser` flags: `user.flags_changed`, with before and after;
- its creation and deletion (`user.created`, `user.deleted`), and a group's creation, renaming and
  deletion (`group.created`, `group.renamed`, `group.deleted`: a group's name is a role).

Each event is written inside the transaction of the change when there is one (the admin site,
grant_role and audit.grants.user_set_roles all change users in one; Django's m2m managers always do),
so a change rolled back takes its event with it. A bare `user.save()` in autocommit mode (a shell)
commits its row first and its event right after: Django sends post_save outside the save's own
transaction, so no signal can do better there.

The actor is whoever `acting_as()` names (the admin site names the signed-in user, grant_role itself);
otherwise the management command running (`manage.py createsuperuser`, `manage.py shell`) or
"unattributed".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.signals import m2m_changed, post_save, pre_delete, pre_save

from accounts.roles import user_roles

from .actions import Action
from .services import Actor, event_record

FLAGS = ("is_active", "is_staff", "is_superuser")
MAX_LISTED = 500  # members named in a group's event; more are counted

_actor: ContextVar[Actor | None] = ContextVar("audit_user_events_actor", default=None)
_summarised: ContextVar[frozenset] = ContextVar("audit_user_events_summarised", default=frozenset())


@contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    """Changes made inside are recorded with `actor` as their actor."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


@contextmanager
def summarised_by_caller(user: Any) -> Iterator[None]:
    """Group changes of `user` made inside are not recorded one by one: the caller records them in one
    event of its own, in the same transaction (grant_role's `user.roles_set`). Flags, creation and
    deletion are still recorded."""
    token = _summarised.set(_summarised.get() | {user.pk})
    try:
        yield
    finally:
        _summarised.reset(token)


def current_actor() -> Actor:
    actor = _actor.get()
    if actor is not None:
        return actor
    argv = sys.argv
    if len(argv) > 1 and os.path.basename(argv[0]) in ("manage.py", "django-admin"):
        return Actor.service(f"manage.py {argv[1]}"[:150])
    return Actor.service("unattributed")


def _record(action: str, obj: Any, payload: dict[str, Any]) -> None:
    with transaction.atomic():  # a savepoint of the change's transaction when there is one
        event_record(actor=current_actor(), action=action, obj=obj, payload=payload)


def _group_names(user: Any) -> list[str]:
    return sorted(user.groups.values_list("name", flat=True))


def _roles(user: Any) -> list[str]:

    return sorted(user_roles(user))


def _members(group: Group) -> dict[str, Any]:
    names = list(group.user_set.order_by("pk").values_list("username", flat=True)[: MAX_LISTED + 1])
    return {"members": names[:MAX_LISTED], "member_count": group.user_set.count()}


# --- a user's flags, creation and deletion ----------------------------------------------------


def on_user_pre_save(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    instance._audit_flags_before = None
    if instance.pk is None or instance._state.adding:
        return
    if update_fields is not None and not set(update_fields) & {*FLAGS, "password"}:
        return  # e.g. last_login on each sign-in: no flag can change
    instance._audit_flags_before = (
        sender._default_manager.filter(pk=instance.pk).values(*FLAGS, "password").first()
    )


def on_user_post_save(sender, instance, created, raw=False, **kwargs) -> None:
    if created:
        _record(
            Action.USER_CREATED,
            instance,
            {"username": instance.get_username(), **{f: getattr(instance, f) for f in FLAGS}},
        )
        return
    before = instance.__dict__.pop("_audit_flags_before", None)
    if not before:
        return
    if before["password"] != instance.password:  # set by the user, an admin or a shell: who, never what
        _record(Action.USER_PASSWORD_CHANGED, instance, {"username": instance.get_username()})
    changed = {f: [before[f], getattr(instance, f)] for f in FLAGS if before[f] != getattr(instance, f)}
    if changed:
        _record(
            Action.USER_FLAGS_CHANGED,
            instance,
            {"username": instance.get_username(), "changed": changed, "roles": _roles(instance)},
        )


def on_user_pre_delete(sender, instance, **kwargs) -> None:
    _record(
        Action.USER_DELETED,
        instance,
        {
            "username": instance.get_username(),
            "groups": _group_names(instance),
            **{f: getattr(instance, f) for f in FLAGS},
        },
    )


# --- a user's groups ---------------------------------------------------------------------------


def on_groups_changed(sender, instance, action, reverse, model, pk_set, **kwargs) -> None:
    """User.groups.through changed, from the user's side (reverse=False: instance is a user, pk_set
    group ids) or the group's (reverse=True: instance is a group, pk_set user ids)."""
    if action in ("pre_remove", "pre_clear"):
        # What is really there before it goes (remove() names ids whether present or not).
        if reverse:
            users = instance.user_set.all() if pk_set is None else instance.user_set.filter(pk__in=pk_set)
            instance._audit_leaving = list(users)
        else:
            groups = instance.groups.all() if pk_set is None else instance.groups.filter(pk__in=pk_set)
            instance._audit_leaving = sorted(groups.values_list("name", flat=True))
        return
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    if action == "post_add":
        if not pk_set:
            return
        if reverse:
            changes = [(user, [instance.name], []) for user in model._default_manager.filter(pk__in=pk_set)]
        else:
            names = sorted(model._default_manager.filter(pk__in=pk_set).values_list("name", flat=True))
            changes = [(instance, names, [])]
    else:
        leaving = instance.__dict__.pop("_audit_leaving", [])
        if not leaving:
            return
        changes = [(user, [], [instance.name]) for user in leaving] if reverse else [(instance, [], leaving)]
    skip = _summarised.get()
    for user, added, removed in changes:
        if user.pk in skip:
            continue
        _record(
            Action.USER_GROUPS_CHANGED,
            user,
            {
                "username": user.get_username(),
                "added": added,
                "removed": removed,
                "groups": _group_names(user),
                "roles": _roles(user),
                "via": "group" if reverse else "user",
            },
        )


# --- groups (a group's name is a role) ---------------------------------------------------------


def on_group_pre_save(sender, instance, raw=False, **kwargs) -> None:
    instance._audit_name_before = None
    if instance.pk is not None and not instance._state.adding:
        instance._audit_name_before = (
            Group.objects.filter(pk=instance.pk).values_list("name", flat=True).first()
        )


def on_group_post_save(sender, instance, created, raw=False, **kwargs) -> None:
    before = instance.__dict__.pop("_audit_name_before", None)
    if created:
        _record(Action.GROUP_CREATED, instance, {"name": instance.name})
    elif before is not None and before != instance.name:
        _record(Action.GROUP_RENAMED, instance, {"from": before, "to": instance.name, **_members(instance)})


def on_group_pre_delete(sender, instance, **kwargs) -> None:
    _record(Action.GROUP_DELETED, instance, {"name": instance.name, **_members(instance)})


def connect() -> None:
    user_model = get_user_model()
    pre_save.connect(on_user_pre_save, sender=user_model, dispatch_uid="audit-user-pre-save")
    post_save.connect(on_user_post_save, sender=user_model, dispatch_uid="audit-user-post-save")
    pre_delete.connect(on_user_pre_delete, sender=user_model, dispatch_uid="audit-user-pre-delete")
    m2m_changed.connect(on_groups_changed, sender=user_model.groups.through, dispatch_uid="audit-user-groups")
    pre_save.connect(on_group_pre_save, sender=Group, dispatch_uid="audit-group-pre-save")
    post_save.connect(on_group_post_save, sender=Group, dispatch_uid="audit-group-post-save")
    pre_delete.connect(on_group_pre_delete, sender=Group, dispatch_uid="audit-group-pre-delete")
