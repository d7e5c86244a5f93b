"""Changes of who may do what are audited wherever they are made: a user's groups (its roles) and its
active, staff and superuser flags, from the admin site, a shell, createsuperuser, grant_role or code;
in the transaction of the change."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import transaction
from django.test import Client

from audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def events(action: str, user=None):
    qs = AuditEvent.objects.filter(action=action)
    if user is not None:
        qs = qs.filter(object_type="user", object_id=str(user.pk))
    return qs.order_by("id")


@pytest.fixture
def groups(db) -> dict[str, Group]:
    return {name: Group.objects.get_or_create(name=name)[0] for name in ("auditor", "operator", "admin")}


def test_a_group_added_in_the_admin_is_an_audit_event_by_the_admin(make_user, groups):
    root = make_user("root", "admin")
    bob = make_user("bob")
    client = Client()
    client.force_login(root)
    url = f"/admin/auth/user/{bob.pk}/change/"
    form = client.get(url).context["adminform"].form
    data = {name: form[name].value() or "" for name in form.fields if name not in ("groups", "password")}
    data.update({"is_active": "on", "groups": [groups["operator"].pk], "_save": "Save"})
    for flag in ("is_superuser",):
        data.pop(flag, None)

    response = client.post(url, data)

    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    event = events("user.groups_changed", bob).get()
    assert event.payload["added"] == ["operator"] and event.payload["removed"] == []
    assert event.payload["roles"] == ["operator"]
    assert (event.actor_type, event.actor_name) == ("user", "root")


def test_superuser_and_active_flags_changed_in_the_admin_are_audit_events(make_user):
    root = make_user("root", "admin")
    bob = make_user("bob")
    client = Client()
    client.force_login(root)
    url = f"/admin/auth/user/{bob.pk}/change/"
    form = client.get(url).context["adminform"].form
    data = {name: form[name].value() or "" for name in form.fields if name not in ("groups", "password")}
    data.update({"is_superuser": "on", "email": "bob@example.org", "_save": "Save"})
    data.pop("is_active", None)  # unchecked: deactivated

    assert client.post(url, data).status_code == 302

    event = events("user.flags_changed", bob).get()
    assert event.payload["changed"] == {"is_active": [True, False], "is_superuser": [False, True]}
    assert event.actor_name == "root"
    updated = events("user.updated", bob).get()
    assert updated.payload["changed"] == ["email"]  # names only: never a value of a password field


def test_groups_changed_from_code_either_side_and_cleared_are_audit_events(make_user, groups):
    bob = make_user("bob")
    with transaction.atomic():
        bob.groups.add(groups["auditor"], groups["operator"])
    groups["admin"].user_set.add(bob)
    bob.groups.remove(groups["auditor"], groups["admin"])
    bob.groups.remove(groups["auditor"])  # not a member any more: nothing changes, nothing recorded
    bob.groups.clear()

    changes = [
        (e.payload["added"], e.payload["removed"], e.payload["via"])
        for e in events("user.groups_changed", bob)
    ]
    assert changes == [
        (["auditor", "operator"], [], "user"),
        (["admin"], [], "group"),
        ([], ["admin", "auditor"], "user"),
        ([], ["operator"], "user"),
    ]
    last = events("user.groups_changed", bob).last()
    assert last.payload["groups"] == [] and last.payload["roles"] == []
    assert last.actor_type == "service" and last.actor_name == "unattributed"


def test_a_groups_members_cleared_from_the_group_side_are_each_an_event(make_user, groups):
    ann, bob = make_user("ann", "operator"), make_user("bob", "operator")
    groups["operator"].user_set.clear()
    for user in (ann, bob):
        assert events("user.groups_changed", user).last().payload["removed"] == ["operator"]


def test_staff_and_superuser_flags_saved_from_a_shell_are_audit_events(make_user):
    bob = make_user("bob")
    bob.is_staff = True
    bob.save()
    bob.save()  # no change, no event
    bob.is_superuser = True
    bob.is_active = False
    bob.save(update_fields=["is_superuser", "is_active"])
    bob.last_login = None
    bob.save(update_fields=["last_login"])  # no flag in it: not even read

    changed = [e.payload["changed"] for e in events("user.flags_changed", bob)]
    assert changed == [
        {"is_staff": [False, True]},
        {"is_active": [True, False], "is_superuser": [False, True]},
    ]


def test_createsuperuser_is_an_audit_event(monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a long passphrase")
    call_command("createsuperuser", username="boss", email="", interactive=False, stdout=io.StringIO())

    boss = get_user_model().objects.get(username="boss")
    event = events("user.created", boss).get()
    assert event.payload["is_superuser"] is True and event.payload["is_staff"] is True


def test_a_change_rolled_back_takes_its_event_with_it(make_user, groups):
    bob = make_user("bob")
    with pytest.raises(RuntimeError), transaction.atomic():
        bob.groups.add(groups["admin"])
        bob.is_superuser = True
        bob.save()
        raise RuntimeError("changed my mind")

    assert not events("user.groups_changed", bob).exists()
    assert not events("user.flags_changed", bob).exists()


def test_grant_role_records_one_summary_not_one_event_per_group(make_user):
    carol = make_user("carol", "auditor")
    before = events("user.groups_changed", carol).count()

    call_command("grant_role", "carol", "operator", "ml_staff", stdout=io.StringIO())

    assert events("user.groups_changed", carol).count() == before
    summary = events("user.roles_set", carol).get()
    assert summary.payload == {
        "roles": ["ml_staff", "operator"],
        "added": ["ml_staff", "operator"],
        "removed": ["auditor"],
    }
    assert summary.actor_name == "grant_role"


def test_grant_role_create_records_the_new_user(db):
    call_command("grant_role", "robot", "operator", "--create", "--no-password", stdout=io.StringIO())

    robot = get_user_model().objects.get(username="robot")
    created = events("user.created", robot).get()
    assert created.actor_name == "grant_role"
    assert events("user.roles_set", robot).get().payload["added"] == ["operator"]


def test_renaming_a_group_and_deleting_users_or_groups_are_audit_events(make_user, groups):
    bob = make_user("bob", "auditor")
    group = groups["auditor"]
    group.name = "admin-ish"
    group.save()
    renamed = AuditEvent.objects.get(action="group.renamed", object_id=str(group.pk))
    assert renamed.payload["from"] == "auditor" and renamed.payload["members"] == ["bob"]

    bob.delete()
    deleted = AuditEvent.objects.get(action="user.deleted")
    assert deleted.payload["username"] == "bob" and deleted.payload["groups"] == ["admin-ish"]
    group.delete()
    assert AuditEvent.objects.filter(action="group.deleted", payload__name="admin-ish").exists()


def test_a_password_set_anywhere_is_an_audit_event_that_holds_no_password(make_user):
    bob = make_user("bob")
    bob.set_password("a brand new passphrase")
    bob.save()
    bob.save()  # no change, no event
    [event] = events("user.password_changed", bob)
    assert event.payload == {"username": "bob"}
    assert "passphrase" not in str(AuditEvent.objects.values_list("payload", flat=True))
