"""Browser tests: a real Chromium, driven by Playwright's sync API, against pytest-django's live server.

The live server (`live_server`) runs the project's WSGI app in a thread of this process and serves
static files through Django's StaticFilesHandler, so the stylesheet loads without `collectstatic`.
Tests that use it need committed data: mark them `django_db(transaction=True)`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"  # git-ignored
CHROMIUM = "/usr/bin/chromium"  # Debian's package; Playwright's own browser is never downloaded
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    # Playwright's sync API runs its asyncio loop in a greenlet of this thread, and the loop stays
    # marked as running in this thread while Playwright is started. Django's ORM then refuses to run
    # here (SynchronousOnlyOperation) though nothing is async: allow it while, and only while,
    # Playwright is up.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    finally:
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Browser, live_server) -> Iterator[Page]:
    """A fresh browser context (no cookies) on the live server; relative URLs go to it."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def on_response(response) -> None:
        # A 4xx/5xx for anything the page loads (the stylesheet included) fails the test; the
        # favicon Chromium asks for on its own does not exist in this project.
        if response.status >= 400 and not response.url.endswith("/favicon.ico"):
            errors.append(f"HTTP {response.status} {response.url}")

    page.on("response", on_response)
    yield page
    context.close()
    assert not errors, f"the browser saw errors: {errors}"


@pytest.fixture
def log_in(page: Page, live_server, make_user) -> Callable[..., object]:
    """`log_in("grace", "operator")`: create that user with those roles and log in through the real
    form at /login/. The login lands on the task list, which needs a role: give at least one."""

    def _log_in(username: str = "grace", *roles: str):
        user = make_user(username, *roles, password=PASSWORD)
        page.goto("/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(re.compile(re.escape(live_server.url) + r"/$"))
        expect(page.locator("form.logout")).to_contain_text(username)
        return user

    return _log_in


@pytest.fixture
def screenshot(page: Page) -> Callable[[str], Path]:
    """`screenshot("name")`: a full-page PNG at test-artifacts/screenshots/<name>.png."""

    def _screenshot(name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 0
        return path

    return _screenshot
