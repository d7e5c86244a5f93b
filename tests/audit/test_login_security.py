"""Login throttling (django-axes), the bounded audit of failed logins, and the password rules.

Checked: repeated wrong passwords lock the login (the right one is then refused too), failed logins
are audited within a bound rather than one global-chain event each, and `grant_role --create`
refuses a password that fails Django's password rules.
"""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
PER_USER, PER_IP = 5, 20


def log_in(username: str, password: str, ip: str = "10.0.0.1", path: str = "/login/", **extra):
    client = Client(REMOTE_ADDR=ip, **extra)
    return client, client.post(path, {"username": username, "password": password})


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def auth_events(**match) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action__startswith="auth.", **match).order_by("id"))


def test_the_defaults():
    assert (settings.LOGIN_FAILURES_PER_USER, settings.LOGIN_FAILURES_PER_IP) == (PER_USER, PER_IP)
    cool_off = settings.AXES_COOLOFF_TIME
    assert cool_off == timedelta(minutes=15)
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"


def test_six_wrong_passwords_lock_the_username_and_the_right_one_is_then_refused(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    for _ in range(PER_USER + 1):
        log_in("ann", "wrong password")

    client, response = log_in("ann", PASSWORD)

    assert response.status_code == 429
    page = response.content.decode()
    assert "Login locked" in page and "for this account" in page
    assert "locked for 15 minutes" in page
    assert response["Retry-After"] == "900"
    assert not logged_in(client)
    # From any other address too: the lock is on the username.
    client, response = log_in("ann", PASSWORD, ip="10.9.9.9")
    assert response.status_code == 429 and not logged_in(client)


def test_thirty_wrong_passwords_in_a_row_do_not_open_the_account(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    statuses = [log_in("ann", f"guess {i}")[1].status_code for i in range(30)]
    assert statuses[: PER_USER - 1] == [200] * (PER_USER - 1)  # the form again, with its error
    assert set(statuses[PER_USER - 1 :]) == {429}
    client, response = log_in("ann", PASSWORD)
    assert response.status_code == 429 and not logged_in(client)


def test_an_address_trying_many_usernames_is_locked_and_others_are_not(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    for i in range(PER_IP - 1):
        log_in(f"guess-{i}", "wrong password", ip="10.6.6.6")
    client, response = log_in("ann", PASSWORD, ip="10.6.6.6")
    assert response.status_code == 302 and logged_in(client)  # 19 failures: not yet

    for i in range(PER_IP):
        log_in(f"guess-{i}", "wrong password", ip="10.7.7.7")
    client, response = log_in("ann", PASSWORD, ip="10.7.7.7")
    assert response.status_code == 429 and not logged_in(client)
    assert "from this address" in response.content.decode()

    client, response = log_in("ann", PASSWORD, ip="10.0.0.2")
    assert response.status_code == 302 and logged_in(client)


def test_fewer_failures_than_the_limit_do_not_lock_and_a_success_forgets_them(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    for _ in range(PER_USER - 1):
        log_in("ann", "wrong password")
    client, response = log_in("ann", PASSWORD)
    assert response.status_code == 302 and logged_in(client)
    assert not AccessAttempt.objects.filter(username="ann").exists()
    for _ in range(PER_USER - 1):
        log_in("ann", "wrong password")
    assert log_in("ann", PASSWORD)[1].status_code == 302


def test_logging_in_to_ones_own_account_does_not_reset_the_count_on_another(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    make_user("mallory", "auditor", password=PASSWORD)
    for _ in range(PER_USER - 1):
        log_in("ann", "wrong password", ip="10.6.6.6")
    assert log_in("mallory", PASSWORD, ip="10.6.6.6")[1].status_code == 302
    log_in("ann", "wrong password", ip="10.6.6.6")

    client, response = log_in("ann", PASSWORD, ip="10.0.0.2")
    assert response.status_code == 429 and not logged_in(client)


def test_the_lock_ends_after_the_cool_off_and_the_page_says_how_long_is_left(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    for _ in range(PER_USER):
        log_in("ann", "wrong password")
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=10, seconds=30))
    response = log_in("ann", PASSWORD)[1]
    assert response.status_code == 429
    assert "locked for 5 minutes" in response.content.decode()

    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    client, response = log_in("ann", PASSWORD)
    assert response.status_code == 302 and logged_in(client)


def test_a_flood_of_failures_adds_a_bounded_number_of_audit_events(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    for _ in range(200):  # one address, one username
        log_in("ann", "wrong password", ip="10.1.1.1")
    for i in range(200):  # one address, a new username each time
        log_in(f"=cmd-{i}", "wrong password", ip="10.2.2.2")
    for i in range(200):  # a new address each time, one username
        log_in("bob", "wrong password", ip=f"10.3.{i // 250}.{i % 250}")

    one = auth_events(payload__ip="10.1.1.1")
    assert [e.action for e in one] == ["auth.login_failed", "auth.locked_out"]
    assert one[1].payload["username"] == "ann" and one[1].payload["locked"] == ["username"]
    assert one[1].payload["failures"] == PER_USER and one[1].payload["locked_for_s"] == 900

    rotating = auth_events(payload__ip="10.2.2.2")
    assert len(rotating) == PER_IP  # the documented bound per address
    assert [e.action for e in rotating] == ["auth.login_failed"] * (PER_IP - 1) + ["auth.locked_out"]
    assert rotating[-1].payload["locked"] == ["ip_address"]
    assert rotating[-1].payload["failures_ip"] == PER_IP

    spread = auth_events(payload__username="bob")
    assert [e.action for e in spread] == ["auth.login_failed"] * (PER_USER - 1) + ["auth.locked_out"]
    assert len(auth_events()) == 2 + PER_IP + PER_USER


def test_a_hostile_username_is_stored_cut(make_user):
    hostile = '=HYPERLINK("http://evil")' + "x" * 120 + "\u202e"
    log_in(hostile, "wrong password")
    (event,) = auth_events()
    assert event.action == "auth.login_failed"
    assert len(event.payload["username"]) == 64 and event.payload["username"].endswith("…")
    assert len(event.actor_name) == 64 and not event.payload["known_user"]


def test_the_throttle_keeps_no_password(make_user):
    make_user("ann", "auditor", password=PASSWORD)
    log_in("ann", "my-secret-guess-123")
    attempt = AccessAttempt.objects.get(username="ann")
    assert "my-secret-guess-123" not in attempt.post_data
    assert "my-secret-guess-123" not in str([e.payload for e in auth_events()])


def test_the_admin_site_logs_in_through_the_same_throttled_page(make_user):
    make_user("ann", "admin", password=PASSWORD)
    for _ in range(PER_USER):
        log_in("ann", "wrong password")
    # The admin site has no login form of its own: it sends everyone to /login/.
    client = Client(REMOTE_ADDR="10.0.0.1")
    response = client.post("/admin/login/", {"username": "ann", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert not logged_in(client)
    response = client.post(
        "/login/?next=/admin/", {"username": "ann", "password": PASSWORD, "next": "/admin/"}
    )
    assert response.status_code == 429 and not logged_in(client)
    assert client.get("/admin/").status_code == 302


def test_behind_a_proxy_each_client_address_is_counted_apart(settings, make_user):
    settings.LOGIN_PROXY_COUNT = 1
    make_user("ann", "auditor", password=PASSWORD)
    for i in range(PER_IP):
        # What the client put on the left of X-Forwarded-For is not trusted; the proxy's entry is.
        log_in(f"guess-{i}", "x", ip="172.16.0.2", HTTP_X_FORWARDED_FOR=f"10.{i}.0.1, 198.51.100.7")
    proxy = {"ip": "172.16.0.2", "HTTP_X_FORWARDED_FOR": "198.51.100.8"}
    assert log_in("ann", PASSWORD, **proxy)[1].status_code == 302
    proxy = {"ip": "172.16.0.2", "HTTP_X_FORWARDED_FOR": "198.51.100.7"}
    assert log_in("ann", PASSWORD, **proxy)[1].status_code == 429
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"198.51.100.7"}


# --- the lockout page in a real browser ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_in_a_browser_the_lockout_is_a_clear_page_not_an_error(live_server, make_user):
    from tests.browser.conftest import chromium_launched

    make_user("ann", "auditor", password=PASSWORD)
    problems: list[str] = []
    statuses: list[int] = []
    with chromium_launched() as browser:
        page = browser.new_page(base_url=live_server.url)
        page.on(
            "console",
            lambda m: problems.append(m.text) if m.type == "error" and "429" not in m.text else None,
        )
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.on(
            "response",
            lambda r: statuses.append(r.status) if r.url.split("?")[0].endswith("/login/") else None,
        )
        for password in ["wrong"] * PER_USER + [PASSWORD]:
            page.goto("/login/")
            if page.locator("#locked-out").count():
                break
            page.get_by_label("Username").fill("ann")
            page.get_by_label("Password").fill(password)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_load_state()
        text = page.locator("#locked-out").inner_text()
        assert page.locator("form.logout").count() == 0
    assert re.search(r"locked for 1[45] minutes", text), text
    assert 429 in statuses and 500 not in statuses
    assert not problems, problems


# --- password rules ---------------------------------------------------------------------------


def grant_create(username: str, password: str) -> str:
    out = io.StringIO()
    call_command(
        "grant_role", username, "auditor", "--create", stdin=io.StringIO(f"{password}\n"), stdout=out
    )
    return out.getvalue()


def test_the_standard_password_validators_are_configured():
    names = [v["NAME"].rsplit(".", 1)[1] for v in settings.AUTH_PASSWORD_VALIDATORS]
    assert names == [
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
        "UsernameInPasswordValidator",
    ]
    assert settings.AUTH_PASSWORD_VALIDATORS[1]["OPTIONS"]["min_length"] == 12


@pytest.mark.parametrize(
    "username, password, reason",
    [
        ("alice", "a", "too short"),
        ("alice", "password1234", "too common"),
        ("alice", "483920175583", "entirely numeric"),
        ("margaret.hamilton", "margaret.hamilton1", "too similar"),
        ("operator", "operatoroperator", "mostly the username"),
        ("ann", "annannannannann", "mostly the username"),
        ("operator", "Operator2024!!", "mostly the username"),
    ],
)
def test_grant_role_create_applies_the_standard_password_rules(username, password, reason):
    with pytest.raises(CommandError, match=reason):
        grant_create(username, password)
    assert not get_user_model().objects.filter(username=username).exists()


def test_grant_role_create_accepts_a_good_passphrase():
    grant_create("ann", "annotated violet tractor")  # the username inside, not most of it
    grant_create("alice", "violet tractor lantern")
    assert get_user_model().objects.get(username="alice").check_password("violet tractor lantern")


def test_an_ipv6_client_counts_as_its_slash_64(settings, make_user):
    """One client holds a whole /64: each of its addresses must not get a fresh budget."""
    make_user("ann", "auditor", password=PASSWORD)
    for i in range(settings.LOGIN_FAILURES_PER_IP):
        Client(REMOTE_ADDR=f"2001:db8:1:2::{i + 1:x}").post("/login/", {"username": f"u{i}", "password": "x"})
    client = Client(REMOTE_ADDR="2001:db8:1:2:ffff::9")
    response = client.post("/login/", {"username": "ann", "password": PASSWORD})
    assert response.status_code == 429
    other = Client(REMOTE_ADDR="2001:db8:1:3::1")
    assert other.post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 302
