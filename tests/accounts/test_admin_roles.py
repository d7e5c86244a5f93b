"""The admin site by role: who reaches which admin page is decided by our roles, never by `is_staff`
or Django's model permissions. Every ModelAdmin of the site, every identity, its list, add, change and
delete pages; the table is docs/audit.md's "Who reaches which admin page"."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client

from accounts.admin import site
from accounts.models import ApiToken
from audit.grants import token_create
from audit.models import AuditEvent, LegalHold, PolicyRule
from routing.models import ConductorVersion, Task, Worker
from routing.services import TaskSubmission, task_submit
from tests.conftest import ROOT
from tests.routing.test_pool import worker_form_data

pytestmark = pytest.mark.django_db

ROLES = ("auditor", "operator", "ML staff", "admin")
# Not one of our roles: staff with every Django permission, staff allowed to change users, a plain user.
NO_ROLE = ("no role", "staff, every permission", "staff, auth.change_user")
IDENTITIES = ("anonymous", *NO_ROLE, *ROLES, "superuser")
EVERYTHING = "view, add, change"

# What each role may do on each model's admin pages (nobody deletes: disable, deactivate or revoke).
ACCESS: dict[str, dict[str, str]] = {
    "auth.user": {"admin": EVERYTHING},
    "auth.group": {"admin": EVERYTHING},
    "accounts.apitoken": {"admin": "view, revoke"},
    "routing.worker": {"auditor": "view", "operator": "view, change", "admin": EVERYTHING},
    "routing.conductorversion": {
        "auditor": "view",
        "operator": "view",
        "ML staff": "view",
        "admin": EVERYTHING,
    },
    "audit.policyrule": {"auditor": "view", "admin": EVERYTHING},
    "audit.legalhold": {"auditor": "view", "admin": "view"},
}
# Fields only the admin role may change (read-only for the others who may change the model).
ADMIN_ONLY_FIELDS = {"routing.worker": {"api_base", "api_key_env"}, "routing.conductorversion": {"config"}}


def admin_table() -> list[str]:
    head = ["no role (any staff flag or Django permission)", *ROLES]
    lines = ["| admin page | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for label, row in ACCESS.items():
        lines.append(f"| `{label}` | — | " + " | ".join(row.get(r, "—") for r in ROLES) + " |")
    return lines


def label(model) -> str:
    return f"{model._meta.app_label}.{model._meta.model_name}"


@pytest.fixture
def people(make_user) -> dict[str, object | None]:
    users = {"anonymous": None, "no role": make_user("plain")}
    staff = make_user("staff-all")
    staff.is_staff = True
    staff.save()
    staff.user_permissions.set(Permission.objects.all())
    users["staff, every permission"] = staff
    clerk = make_user("staff-clerk")
    clerk.is_staff = True
    clerk.save()
    clerk.user_permissions.set(Permission.objects.filter(codename="change_user"))
    users["staff, auth.change_user"] = clerk
    for role in ROLES:
        users[role] = make_user(role.replace(" ", "-"), "ml_staff" if role == "ML staff" else role)
    users["superuser"] = get_user_model().objects.create_superuser("root", password="y" * 12)
    return users


@pytest.fixture
def objects(people) -> dict[str, object]:
    worker = Worker.objects.create(
        slug="alpha",
        display_name="Alpha",
        litellm_model="openai/alpha",
        vendor="acme",
        input_usd_per_mtok=Decimal("1"),
        output_usd_per_mtok=Decimal("2"),
        price_source=Worker.PriceSource.OVERRIDE,
    )
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    return {
        "auth.user": people["no role"],
        "auth.group": Group.objects.get(name="operator"),
        "accounts.apitoken": token_create(user=people["operator"], role="operator", name="ci"),
        "routing.worker": worker,
        "routing.conductorversion": ConductorVersion.objects.first()
        or ConductorVersion.objects.create(name="static-v1", backend="static"),
        "audit.policyrule": PolicyRule.objects.create(
            name="no-acme", kind="vendor_blocked", vendors=["acme"]
        ),
        "audit.legalhold": LegalHold.objects.create(task_id=task.pk, reason="inquiry", placed_by="root"),
    }


def client_of(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def may(identity: str, model_label: str, action: str) -> bool:
    role = "admin" if identity == "superuser" else identity
    return action in ACCESS[model_label].get(role, "").split(", ")


def outcome(response) -> int | str:
    if response.status_code == 302 and response["Location"].startswith("/login/"):
        return "login"
    return response.status_code


def test_the_table_covers_every_model_admin_of_the_site():
    assert sorted(label(m) for m in site._registry) == sorted(ACCESS)
    assert set(ADMIN_ONLY_FIELDS) <= set(ACCESS)


def test_docs_carry_the_admin_table():
    docs = (ROOT / "docs" / "audit.md").read_text()
    for line in admin_table():
        assert line in docs, f"docs/audit.md lacks the admin table line: {line}"


@pytest.mark.parametrize("identity", IDENTITIES)
def test_every_admin_page_answers_each_identity_by_role(identity, people, objects):
    client = client_of(people[identity])
    index = client.get("/admin/")
    if identity == "anonymous":
        assert outcome(index) == "login"
    elif identity in NO_ROLE:
        assert index.status_code == 403
    else:
        assert index.status_code == 200

    for model in site._registry:
        key = label(model)
        obj = objects[key]
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        pages = {
            "view": base,
            "add": f"{base}add/",
            "change": f"{base}{obj.pk}/change/",
            "delete": f"{base}{obj.pk}/delete/",
        }
        for action, url in pages.items():
            response = client.get(url)
            seen = outcome(response)
            where = f"GET {url} as {identity}: {seen}"
            if identity == "anonymous":
                assert seen == "login", where
            elif identity in NO_ROLE:
                assert seen == 403, where  # never 200, whatever is_staff and Django permissions say
            elif action == "change":  # the change page, read-only for those who may only view
                assert seen == (200 if may(identity, key, "view") else 403), where
            else:
                assert seen == (200 if may(identity, key, action) else 403), where
        if identity not in ("anonymous", *NO_ROLE):
            index_links = index.content.decode()
            assert (base in index_links) is may(identity, key, "view"), f"index link {base} as {identity}"


def test_a_view_only_role_cannot_post_a_change(people, objects):
    version = objects["routing.conductorversion"]
    client = client_of(people["operator"])
    url = f"/admin/routing/conductorversion/{version.pk}/change/"
    response = client.post(url, {"name": "renamed", "backend": "static", "config": "{}", "_save": "Save"})
    assert response.status_code == 403
    version.refresh_from_db()
    assert version.name != "renamed"


def test_a_staff_user_with_every_permission_cannot_change_a_user_or_its_groups(people, objects):
    target = objects["auth.user"]
    client = client_of(people["staff, every permission"])
    response = client.post(
        f"/admin/auth/user/{target.pk}/change/",
        {"username": target.username, "is_active": "on", "is_superuser": "on", "groups": [1, 2, 3, 4]},
    )
    assert response.status_code == 403
    target.refresh_from_db()
    assert not target.is_superuser and not target.groups.exists()


def test_an_operator_cannot_change_where_a_worker_sends_data_or_which_key(people, objects):
    worker = objects["routing.worker"]
    client = client_of(people["operator"])
    url = f"/admin/routing/worker/{worker.pk}/change/"
    form = client.get(url).context["adminform"].form
    assert not ADMIN_ONLY_FIELDS["routing.worker"] & set(form.fields)  # shown read-only

    response = client.post(
        url,
        worker_form_data(
            worker,
            api_base="https://attacker.example/v1",
            api_key_env="CONDUCTOR_KEY_OTHER",
            description="cheap and quick",
        ),
    )

    assert response.status_code == 302
    worker.refresh_from_db()
    assert (worker.api_base, worker.api_key_env) == ("", "")
    assert worker.description == "cheap and quick"  # what an operator may change, it changes
    event = AuditEvent.objects.get(action="worker.updated", object_id=str(worker.pk))
    assert set(event.payload["changed"]) == {"description"}


def test_the_admin_role_changes_a_workers_endpoint(people, objects):
    worker = objects["routing.worker"]
    client = client_of(people["admin"])
    url = f"/admin/routing/worker/{worker.pk}/change/"
    assert ADMIN_ONLY_FIELDS["routing.worker"] <= set(client.get(url).context["adminform"].form.fields)

    response = client.post(
        url, worker_form_data(worker, api_base="https://llm.internal/v1", api_key_env="CONDUCTOR_KEY_LLM")
    )

    assert response.status_code == 302
    worker.refresh_from_db()
    assert (worker.api_base, worker.api_key_env) == ("https://llm.internal/v1", "CONDUCTOR_KEY_LLM")
    event = AuditEvent.objects.get(action="worker.endpoint_changed", object_id=str(worker.pk))
    assert event.actor_name == people["admin"].username and event.payload["via"] == "admin"
    assert event.payload["api_base"]["to"] == "https://llm.internal/v1"
    assert event.payload["api_key_env"] == {"from": "", "to": "CONDUCTOR_KEY_LLM"}


@pytest.mark.parametrize("role", ["auditor", "operator", "ML staff"])
def test_a_conductor_versions_config_is_read_only_but_for_the_admin_role(role, people, objects):
    version = objects["routing.conductorversion"]
    url = f"/admin/routing/conductorversion/{version.pk}/change/"
    form = client_of(people[role]).get(url).context["adminform"].form
    assert "config" not in form.fields
    assert "config" in client_of(people["admin"]).get(url).context["adminform"].form.fields


def test_the_admin_site_has_no_login_of_its_own(people):
    response = Client().get("/admin/login/", {"next": "/admin/routing/worker/"})
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/admin/routing/worker/")
    foreign = Client().get("/admin/login/", {"next": "https://evil.example/"})
    assert "evil.example" not in foreign["Location"]


def test_the_admin_role_revokes_a_token_in_the_admin_and_it_is_audited(people, objects):
    token = objects["accounts.apitoken"]
    client = client_of(people["admin"])
    response = client.post(
        "/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [token.pk], "index": 0}
    )
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == "admin"
    event = AuditEvent.objects.get(action="token.revoked", object_id=str(token.pk))
    assert event.actor_name == "admin"

    # An auditor sees no tokens at all, so cannot revoke one either.
    other = token_create(user=people["auditor"], role="auditor")
    response = client_of(people["auditor"]).post(
        "/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [other.pk], "index": 0}
    )
    assert response.status_code == 403
    assert ApiToken.objects.get(pk=other.pk).revoked_at is None


def test_the_tokens_old_admin_pages_lead_to_their_new_place(people, objects):
    token = objects["accounts.apitoken"]
    client = client_of(people["admin"])
    listed = client.get("/admin/audit/apitoken/", {"role": "operator"})
    assert listed.status_code == 302 and listed["Location"] == "/admin/accounts/apitoken/?role=operator"
    shown = client.get(f"/admin/audit/apitoken/{token.pk}/change/")
    assert shown["Location"] == f"/admin/accounts/apitoken/{token.pk}/change/"
    assert client.get(shown["Location"]).status_code == 200
