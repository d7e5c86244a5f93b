"""Browser tests: a real Chromium, driven by Playwright's sync API, against pytest-django's live server.

The live server (`live_server`) runs the project's WSGI app in a thread of this process and serves
static files through Django's StaticFilesHandler, so the stylesheet loads without `collectstatic`.
Tests that use it need committed data: mark them `django_db(transaction=True)`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def chromium_launched() -> Iterator[Browser]:
    """Debian's Chromium, headless, driven by Playwright's sync API."""
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


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    with chromium_launched() as chromium:
        yield chromium


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
        return log_in_through_the_form(page, live_server.url, make_user(username, *roles, password=PASSWORD))

    return _log_in


def log_in_through_the_form(page: Page, base_url: str, user) -> object:
    """Log `user` in through the real login form; it lands on the task list."""
    page.goto("/login/")
    page.get_by_label("Username").fill(user.get_username())
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(re.escape(base_url) + r"/$"))
    expect(page.locator("form.logout")).to_contain_text(user.get_username())
    return user


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


# --- A real ASGI server (daphne) for the live pages ------------------------------------------------
# The live server above is WSGI: no websockets. These start the project's ASGI application with
# daphne in a process of its own, against the same database and Redis as the test process.


def wait_until(page: Page, predicate: str, timeout: float = 30_000) -> None:
    """Poll `predicate` (a JS expression or function) until it is truthy. Playwright's own
    wait_for_function evaluates its predicate with eval inside the page, which the app's
    Content-Security-Policy (script-src 'self') rightly refuses; page.evaluate is not eval."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout / 1000:.0f}s waiting for {predicate}")
        page.wait_for_timeout(50)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaphneServer:
    """`python -m daphne` on loopback; static files from `collectstatic` into `var_dir`/static (WhiteNoise)."""

    def __init__(self, *, database_url: str, redis_url: str, var_dir: Path, log_path: Path):
        import subprocess
        import sys

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "CONDUCTOR_VAR_DIR": str(var_dir),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
            + ["conductor_web.asgi:application"],
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @staticmethod
    def collectstatic(var_dir: Path, database_url: str, redis_url: str) -> None:
        import subprocess
        import sys

        env = {**os.environ, "CONDUCTOR_VAR_DIR": str(var_dir), "DATABASE_URL": database_url}
        env["REDIS_URL"] = redis_url
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
            cwd=ROOT,
            env=env,
            check=True,
        )

    def wait_ready(self, timeout: float = 60) -> DaphneServer:
        import time
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daphne exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/login/", timeout=2) as response:  # noqa: S310
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"daphne did not answer within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-4000:]

    def stop(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture(scope="module")
def daphne_static(tmp_path_factory, django_db_setup, django_db_blocker) -> Path:
    """A CONDUCTOR_VAR_DIR with the collected static files (plotly.js included)."""
    from django.conf import settings

    from tests.conftest import database_url

    var_dir = tmp_path_factory.mktemp("daphne-var")
    with django_db_blocker.unblock():
        url = database_url()
    DaphneServer.collectstatic(var_dir, url, settings.REDIS_URL)
    assert (var_dir / "static" / "plotly" / "plotly.min.js").exists()
    return var_dir


@pytest.fixture
def daphne_server(transactional_db, daphne_static: Path) -> Iterator[DaphneServer]:
    """The project's ASGI app under daphne, on the test database; stopped after the test."""
    from django.conf import settings

    from tests.conftest import database_url

    server = DaphneServer(
        database_url=database_url(),
        redis_url=settings.REDIS_URL,
        var_dir=daphne_static,
        log_path=daphne_static / "daphne.log",
    )
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture
def asgi_page(browser: Browser, daphne_server: DaphneServer) -> Iterator[Page]:
    """Like `page`, on the daphne server: relative URLs go to it; page errors and HTTP errors fail."""
    context = browser.new_context(base_url=daphne_server.url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "response",
        lambda r: (
            errors.append(f"HTTP {r.status} {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico")
            else None
        ),
    )
    yield page
    context.close()
    assert not errors, f"the browser saw errors: {errors}\n{daphne_server.log()}"


@pytest.fixture
def asgi_log_in(asgi_page: Page, daphne_server: DaphneServer, make_user) -> Callable[..., object]:
    """`asgi_log_in("olga", "operator")`: that user, logged in through the real form on daphne."""

    def _log_in(username: str = "grace", *roles: str):
        return log_in_through_the_form(
            asgi_page, daphne_server.url, make_user(username, *roles, password=PASSWORD)
        )

    return _log_in
