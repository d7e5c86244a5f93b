"""API tokens: the database holds a hash, never the token; the token is shown once; tokens expire and
can be revoked (on /audit/tokens/, audited); an expired or revoked token is refused, saying why."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken
from accounts.tokens import token_hash, token_key_new
from audit.grants import token_create, token_revoke
from audit.models import AuditEvent
from audit.services import Actor

pytestmark = pytest.mark.django_db

TOKENS = "/audit/tokens/"


def api(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def everything_stored() -> str:
    """Every token row and every audit event, as text."""
    rows = [str(r) for r in ApiToken.objects.values()]
    rows += [str(e) for e in AuditEvent.objects.values("payload", "actor_name", "object_id")]
    return "\n".join(rows)


# --- stored as a hash ------------------------------------------------------------------------


def test_the_database_holds_no_token_only_its_hash_and_a_prefix(make_user):
    ann = make_user("ann", "auditor")
    token = token_create(user=ann, role="auditor", name="reports")

    row = ApiToken.objects.get(pk=token.pk)
    assert row.key_hash == hashlib.sha256(token.key.encode()).hexdigest()
    assert token.key.startswith(row.prefix) and len(row.prefix) < 16 and len(token.key) >= 40
    assert token.key not in everything_stored()
    assert not hasattr(row, "key")  # read back, a token cannot be had
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM audit_apitoken")
        assert token.key not in str(cursor.fetchall())

    created = AuditEvent.objects.get(action="token.created", object_id=str(token.pk))
    assert created.payload["prefix"] == row.prefix and row.key_hash not in str(created.payload)
    assert api(token.key).get("/api/tasks/").status_code == 200


def test_its_creation_event_binds_the_row_it_authenticates_with(make_user):
    """What token.created records is what every request the token authenticates is checked against."""
    ann = make_user("ann", "auditor")
    token = token_create(user=ann, role="auditor", name="reports", days=7)

    row = ApiToken.objects.get(pk=token.pk)
    payload = AuditEvent.objects.get(action="token.created", object_id=str(token.pk)).payload
    assert (payload["user_id"], payload["role"], payload["name"]) == (ann.pk, "auditor", "reports")
    assert payload["key_hash_sha256"] == hashlib.sha256(row.key_hash.encode()).hexdigest()
    assert payload["expires_at"].startswith(f"{row.expires_at:%Y-%m-%dT%H:%M:%S}")


def test_a_token_no_event_records_authenticates_nobody(make_user):
    ann = make_user("ann", "auditor")
    key = token_key_new()
    ApiToken.objects.create(
        key_hash=token_hash(key),
        prefix=key[:10],
        user=ann,
        role="auditor",
        expires_at=timezone.now() + timedelta(days=1),
    )

    response = api(key).get("/api/tasks/")

    assert response.status_code in (401, 403)  # 403: the session authenticator comes first
    assert "audit record" in response.json()["detail"]


def test_a_token_expires_by_default_after_the_configured_days_and_at_most_the_maximum(make_user, settings):
    settings.API_TOKEN_DEFAULT_DAYS, settings.API_TOKEN_MAX_DAYS = 30, 60
    ann = make_user("ann", "auditor")
    token = token_create(user=ann, role="auditor")
    assert abs(token.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert token_create(user=ann, role="auditor", days=60).expires_at > token.expires_at
    with pytest.raises(ValueError, match="1 to 60 days"):
        token_create(user=ann, role="auditor", days=61)


# --- refused when expired or revoked ---------------------------------------------------------


def test_an_expired_token_is_refused_saying_so(make_user):
    ann = make_user("ann", "auditor")
    token = token_create(user=ann, role="auditor")
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    response = api(token.key).get("/api/tasks/")

    assert response.status_code in (401, 403)  # 403: the session authenticator comes first
    assert "expired" in response.json()["detail"]


def test_a_revoked_token_is_refused_saying_so(make_user):
    ann = make_user("ann", "auditor")
    token = token_create(user=ann, role="auditor")
    assert token_revoke(token=token, actor=Actor.for_user(ann)) is True
    assert token_revoke(token=token, actor=Actor.for_user(ann)) is False  # once

    response = api(token.key).get("/api/tasks/")

    assert response.status_code in (401, 403)  # 403: the session authenticator comes first
    assert "revoked" in response.json()["detail"]
    assert "invalid" in api(token.key + "x").get("/api/tasks/").json()["detail"]


def test_use_is_noted_on_the_token(make_user):
    ann = make_user("ann", "auditor")
    token = token_create(user=ann, role="auditor")
    assert ApiToken.objects.get(pk=token.pk).last_used_at is None
    api(token.key).get("/api/tasks/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None


# --- the page ----------------------------------------------------------------------------------


def test_a_token_made_on_the_page_is_shown_once(make_user):
    ann = make_user("ann", "auditor", "operator")
    client = session(ann)

    response = client.post(
        TOKENS, {"action": "create", "name": "nightly report", "role": "auditor", "days": "7"}
    )

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(user=ann)
    key = response.context["issued"].key
    assert token.key_hash == token_hash(key)
    assert response.content.decode().count(key) == 1
    assert (token.role, token.name) == ("auditor", "nightly report")
    assert abs(token.expires_at - (timezone.now() + timedelta(days=7))) < timedelta(minutes=1)
    assert api(key).get("/api/tasks/").status_code == 200

    again = client.get(TOKENS)
    assert key not in again.content.decode()
    assert token.prefix in again.content.decode()
    event = AuditEvent.objects.get(action="token.created", object_id=str(token.pk))
    assert event.actor_name == "ann" and key not in str(event.payload)


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        ({"name": "x", "role": "admin", "days": "7"}, "role"),  # a role ann does not hold
        ({"name": "x", "role": "auditor", "days": "366"}, "days"),  # past API_TOKEN_MAX_DAYS
        ({"name": "x", "role": "auditor", "days": "0"}, "days"),
        ({"name": "", "role": "auditor", "days": "7"}, "name"),
    ],
)
def test_the_page_refuses_a_token_it_may_not_make(make_user, form, problem):
    client = session(make_user("ann", "auditor"))
    response = client.post(TOKENS, {"action": "create", **form})
    assert response.status_code == 400
    assert problem in response.context["form"].errors
    assert not ApiToken.objects.exists()


def test_a_user_sees_and_revokes_only_their_own_tokens_the_admin_role_everyones(make_user):
    ann, bob, root = make_user("ann", "auditor"), make_user("bob", "operator"), make_user("root", "admin")
    ann_token = token_create(user=ann, role="auditor", name="ann-script")
    bob_token = token_create(user=bob, role="operator", name="bob-script")

    as_ann = session(ann)
    page = as_ann.get(TOKENS).content.decode()
    assert "ann-script" in page and "bob-script" not in page
    assert as_ann.post(TOKENS, {"action": "revoke", "token": bob_token.pk}).status_code == 404
    assert ApiToken.objects.get(pk=bob_token.pk).revoked_at is None

    assert as_ann.post(TOKENS, {"action": "revoke", "token": ann_token.pk}).status_code == 302
    assert ApiToken.objects.get(pk=ann_token.pk).revoked_by == "ann"

    as_root = session(root)
    page = as_root.get(TOKENS).content.decode()
    assert "ann-script" in page and "bob-script" in page
    assert as_root.post(TOKENS, {"action": "revoke", "token": bob_token.pk}).status_code == 302
    revoked = ApiToken.objects.get(pk=bob_token.pk)
    assert revoked.revoked_at is not None and revoked.revoked_by == "root"
    event = AuditEvent.objects.get(action="token.revoked", object_id=str(bob_token.pk))
    assert event.actor_name == "root" and event.payload["user"] == "bob"
    assert revoked.key_hash not in str(event.payload)
    assert api(bob_token.key).get("/api/tasks/").status_code in (401, 403)


def test_the_page_refuses_odd_requests_with_a_reason(make_user):
    client = session(make_user("ann", "auditor"))
    assert client.post(TOKENS, {"action": "explode"}).status_code == 400
    for odd in ("", "abc", "9" * 40, "-1"):
        assert client.post(TOKENS, {"action": "revoke", "token": odd}).status_code == 404
    assert session(make_user("nobody")).get(TOKENS).status_code == 403
    assert Client().get(TOKENS).status_code == 302


def test_the_nav_links_the_page_for_users_with_a_role(make_user):
    assert f'href="{TOKENS}"' in session(make_user("ann", "auditor")).get("/").content.decode()


# --- grant_role -------------------------------------------------------------------------------


def test_grant_role_prints_the_token_once_with_its_expiry(make_user):
    make_user("ann", "auditor")
    out = io.StringIO()
    call_command("grant_role", "ann", "auditor", "--token", "auditor", "--days", "10", stdout=out)

    key = out.getvalue().split("token (auditor): ", 1)[1].split()[0]
    token = ApiToken.objects.get(key_hash=token_hash(key))
    assert f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" in out.getvalue()
    assert abs(token.expires_at - (timezone.now() + timedelta(days=10))) < timedelta(minutes=1)
    assert AuditEvent.objects.get(action="token.created").actor_name == "grant_role"
    assert key not in everything_stored()


# --- the migration ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # later migrations build indexes CONCURRENTLY: no transaction
def test_the_migration_turns_plaintext_keys_into_hashes(make_user):
    """Migrate audit back to plaintext keys, store one, migrate forward: the key is kept as its hash,
    and is nowhere in the database. No token.created event records it (tokens were not audited then),
    so it authenticates nobody: its user makes a new one."""
    ann = make_user("ann", "auditor")
    executor = MigrationExecutor(connection)
    before = [("audit", "0002_append_only_triggers")]
    latest = executor.loader.graph.leaf_nodes()  # every app's: those that depend on audit's come back too
    executor.migrate(before)
    old_apps = executor.loader.project_state(before).apps
    plaintext = "0123456789abcdef0123456789abcdef01234567"
    old_apps.get_model("audit", "ApiToken").objects.create(key=plaintext, user_id=ann.pk, role="auditor")
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no deferred check pending before ALTER TABLE

    executor = MigrationExecutor(connection)
    executor.migrate(latest)

    token = ApiToken.objects.get(user=ann)
    assert token.key_hash == token_hash(plaintext) and token.prefix == plaintext[:10]
    assert token.expires_at > timezone.now() + timedelta(days=80)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM audit_apitoken")
        assert plaintext not in str(cursor.fetchall())
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'audit_apitoken'"
        )
        assert "key" not in {row[0] for row in cursor.fetchall()}
    refused = api(plaintext).get("/api/tasks/")
    assert refused.status_code in (401, 403) and "audit record" in refused.json()["detail"]
