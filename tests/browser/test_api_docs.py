"""The API's documentation in a real browser: Swagger UI and Redoc render the schema from the app's
own static files, inside the Content-Security-Policy, and ask nothing of another host."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role

pytestmark = pytest.mark.django_db(transaction=True)

WATCH_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI));
"""


def watch(page: Page, live_server) -> list[str]:
    """Requests to any host other than the app's that got an answer, from now on (one the policy
    refused never leaves the browser: it fails, and is listed by the violations instead)."""
    page.add_init_script(WATCH_VIOLATIONS)
    own = urlsplit(live_server.url).netloc
    foreign: list[str] = []
    page.on(
        "requestfinished",
        lambda r: foreign.append(r.url) if urlsplit(r.url).netloc not in (own, "") else None,
    )
    return foreign


def test_swagger_ui_lists_the_api_from_the_nav(page: Page, live_server, log_in, screenshot):
    foreign = watch(page, live_server)
    log_in("olga", Role.OPERATOR)
    page.get_by_role("link", name="API docs").click()
    page.wait_for_url("**/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Conductor Web API")
    tasks = page.locator(".opblock-summary-path", has_text="/api/tasks/").first
    expect(tasks).to_be_visible()
    # Open an operation: its parameters come from the schema (the task filters are documented).
    page.locator(".opblock-get .opblock-summary-path", has_text="/api/tasks/").first.click()
    expect(page.locator(".opblock.is-open .parameters")).to_contain_text("status")
    assert page.evaluate("window.__csp") == []
    assert foreign == []
    screenshot("api-swagger")


def test_redoc_renders_the_schema(page: Page, live_server, log_in, screenshot):
    foreign = watch(page, live_server)
    log_in("aida", Role.AUDITOR)
    page.goto("/api/redoc/")
    expect(page.locator("h1").first).to_contain_text("Conductor Web API", timeout=20_000)
    expect(page.get_by_text("/api/tasks/").first).to_be_attached()
    expect(page.get_by_text("API docs by Redocly")).to_be_attached()  # the menu's footer is drawn
    # Nothing is refused: not its maker's logo (taken out of the bundle the app serves), nor its
    # search worker (from a blob, allowed on this page).
    assert page.evaluate("window.__csp") == []
    assert foreign == []
    screenshot("api-redoc")
