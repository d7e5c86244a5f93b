"""Transport and headers: the documented production environment passes `check --deploy` with no
warning, every page carries a strict Content-Security-Policy, and compose publishes nothing publicly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.conf import settings as django_settings

# The browser tests' fixtures: Chromium and the project on daphne (websockets).
from tests.browser.conftest import (  # noqa: F401
    asgi_log_in,
    asgi_page,
    chromium_launched,
    daphne_server,
    daphne_static,
)

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = (ROOT / "docs" / "configuration.md").read_text()


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment docs/configuration.md ("Production settings") documents, with this test run's
    services (so that nothing embedded starts)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CONDUCTOR_"))}
    env.update(
        {
            "DATABASE_URL": django_settings.DATABASE_URL,
            "REDIS_URL": django_settings.REDIS_URL,
            "CONDUCTOR_VAR_DIR": str(tmp_path / "var"),
            "DJANGO_SECURE": "true",
            "DJANGO_SECRET_KEY": "k3y-" + "x9Q2#mZ7!pL4&vT8" * 4,
            "DJANGO_ALLOWED_HOSTS": "conductor.example.com",
            "DJANGO_CSRF_TRUSTED_ORIGINS": "https://conductor.example.com",
            "DJANGO_REQUIRE_SECRET_KEY": "true",
        }
    )
    env.update(extra)
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_with_the_documented_production_settings_prints_no_warning(tmp_path):
    env = production_env(tmp_path)
    for name in ("DJANGO_SECURE", "DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DJANGO_CSRF_TRUSTED_ORIGINS"):
        assert f"`{name}`" in DOCS, f"{name} is not documented in docs/configuration.md"

    result = check_deploy(env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


def test_without_the_production_switch_check_deploy_names_what_is_missing(tmp_path):
    result = check_deploy(production_env(tmp_path, DJANGO_SECURE="false"))
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stdout + result.stderr


def test_each_production_value_can_be_set_alone(tmp_path):
    env = production_env(tmp_path, DJANGO_SECURE_HSTS_SECONDS="600", DJANGO_SECURE_SSL_REDIRECT="false")
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='conductor_web.settings'; django.setup();"
        "from django.conf import settings as s;"
        "print(s.SECURE_HSTS_SECONDS, s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.split()[-4:] == ["600", "False", "True", "True"], out.stderr


@pytest.mark.django_db
def test_pages_carry_a_strict_content_security_policy_and_the_other_headers(client):
    response = client.get("/login/")
    assert response.status_code == 200
    policy = dict(
        (directive.split()[0], directive.split()[1:])
        for directive in response["Content-Security-Policy"].split(";")
        if directive.strip()
    )
    assert policy["script-src"] == ["'self'"]  # no inline script, no eval, no third party
    assert policy["default-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'", "'unsafe-inline'"]  # plotly.js sets style attributes
    assert policy["img-src"] == ["'self'", "data:"]
    assert policy["connect-src"] == ["'self'"]  # covers ws:/wss: of the same origin (browser test below)
    assert policy["frame-ancestors"] == ["'none'"] and policy["object-src"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"]
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


def test_local_runs_stay_on_plain_http(tmp_path):
    """Without DJANGO_SECURE (make demo on http://127.0.0.1): no redirect, no Secure-only cookies, no HSTS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(DATABASE_URL=django_settings.DATABASE_URL, REDIS_URL=django_settings.REDIS_URL)
    env["CONDUCTOR_VAR_DIR"] = str(tmp_path / "var")
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='conductor_web.settings'; django.setup();"
        "from django.conf import settings as s;"
        "print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS,"
        " s.SECURE_PROXY_SSL_HEADER, s.SESSION_COOKIE_HTTPONLY, s.X_FRAME_OPTIONS)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.split()[-7:] == ["False", "False", "False", "0", "None", "True", "DENY"], out.stderr


def test_no_template_carries_inline_script():
    """script-src 'self' would silently stop an inline script: keep every script in static/js."""
    offenders = []
    for path in (ROOT / "templates").rglob("*.html"):
        text = path.read_text()
        for match in re.finditer(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", text):
            offenders.append(f"{path.relative_to(ROOT)}: {match.group()}")
        if re.search(r"\son[a-z]+\s*=", text):
            offenders.append(f"{path.relative_to(ROOT)}: an on*= handler")
    assert not offenders, offenders


def test_compose_publishes_ports_on_loopback_only():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


# --- the policy fits the pages: a real Chromium on daphne (websockets), no violation reported --------

WATCH_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI + " " + e.sourceFile + ":" + e.lineNumber));
"""


@pytest.fixture(scope="module")
def browser():
    """Chromium for this module only (the browser package's own is package-scoped: one at a time)."""
    with chromium_launched() as chromium:
        yield chromium


@pytest.mark.django_db(transaction=True)
def test_the_policy_lets_the_live_pages_work_and_is_never_violated(asgi_page, asgi_log_in):  # noqa: F811
    from playwright.sync_api import expect

    from accounts.models import Role
    from routing.models import Task
    from routing.services import TaskSubmission, task_submit

    page = asgi_page
    page.add_init_script(WATCH_VIOLATIONS)
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    asgi_log_in("olga", Role.OPERATOR)
    task, _ = task_submit(submission=TaskSubmission(text="Nobody runs me"), source=Task.Source.API)

    page.goto(f"/tasks/{task.pk}/graph/")  # plotly.js and the task's websocket
    expect(page.locator("#live-state")).to_have_text("live")
    expect(page.locator("#graph .main-svg").first).to_be_attached()
    violations = page.evaluate("window.__csp")
    page.goto("/ops/")  # static/js/ops.js, once inline
    expect(page.locator("#ops-body")).to_be_visible()
    page.wait_for_timeout(5_500)  # one refresh
    violations += page.evaluate("window.__csp")
    page.goto("/analytics/")
    page.wait_for_load_state("networkidle")
    violations += page.evaluate("window.__csp")

    inline = "document.querySelector('script:not([src]):not([type=\"application/json\"])')"
    assert page.evaluate(inline) is None
    assert not violations, violations
    assert not console, console
    # The watch itself works: an image from elsewhere is refused and reported.
    page.evaluate("document.body.append(Object.assign(new Image(), {src: 'http://203.0.113.9/x.png'}))")
    page.wait_for_timeout(500)
    assert any(v.startswith("img-src") for v in page.evaluate("window.__csp"))
