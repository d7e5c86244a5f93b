"""The sweep in Chromium: every page each role may open, on the record the real engine made, served by
daphne. No console error, no failed request, nothing wider than a 1,400 px window, every chart drawn.
Full-page screenshots go to test-artifacts/screenshots/sweep/ and each page's load time to
test-artifacts/sweep-load-times.json."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.acceptance.conftest import SESSION_COOKIES
from tests.acceptance.test_sweep import EXPECTED, MAIN_ROUTES, route_path
from tests.browser.conftest import ROOT, DaphneServer, chromium_launched, wait_until

pytestmark = pytest.mark.django_db

WIDTH = 1400
SHOTS = ROOT / "test-artifacts" / "screenshots" / "sweep"
TIMES = ROOT / "test-artifacts" / "sweep-load-times.json"
ROLES = ("auditor", "operator", "ML staff", "admin")
CHARTS_DRAWN = """() => [...document.querySelectorAll('.chart')].every(
    c => c.querySelector('.main-svg') || c.textContent.trim().length > 0)"""


@pytest.fixture(scope="package")
def daphne(record, identities) -> Iterator[DaphneServer]:
    """The ASGI app on the record's database, with the record's files (VAR_DIR) and static files."""
    from tests.conftest import database_url

    var_dir = settings.VAR_DIR
    (var_dir / "secret_key").write_text(
        settings.SECRET_KEY
    )  # the sessions of `identities` are signed with it
    url = database_url()
    DaphneServer.collectstatic(var_dir, url, settings.REDIS_URL)
    server = DaphneServer(
        database_url=url, redis_url=settings.REDIS_URL, var_dir=var_dir, log_path=var_dir / "daphne.log"
    )
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="package")
def chromium(daphne):
    with chromium_launched() as browser:
        yield browser


LIVE_SETTLED = "() => !window.Live || window.Live.settled()"


class Visit:
    """One browser context logged in as `identity` (its session cookie), collecting what went wrong."""

    def __init__(self, browser, server: DaphneServer, identity: str):
        self.identity = identity
        self.context_base = server.url
        self.context = browser.new_context(base_url=server.url, viewport={"width": WIDTH, "height": 900})
        self.context.set_default_timeout(20_000)
        name, _, value = SESSION_COOKIES[identity].partition("=")
        self.context.add_cookies([{"name": name, "value": value, "url": server.url}])
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        self.page.on(
            "console", lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None
        )
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} {r.failure}"))
        self.page.on(
            "response",
            lambda r: self.problems.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None,
        )

    def open(self, path: str, shot: str) -> float:
        started = time.monotonic()
        response = self.page.goto(path, wait_until="load")
        assert response is not None and response.status == 200, f"{path} as {self.identity}: {response}"
        assert self.page.url == self.context_base + path, f"{path} as {self.identity} went to {self.page.url}"
        self.page.wait_for_load_state("networkidle")
        wait_until(self.page, CHARTS_DRAWN)
        # A live page has caught up (its socket open and read since): leaving now cuts no read short.
        wait_until(self.page, LIVE_SETTLED)
        elapsed = time.monotonic() - started
        where = f"{path} as {self.identity}"
        # The tab's title is text: no markup spilled into it (a block left open in a template).
        title = self.page.title()
        assert title.endswith("Conductor Web") and "<" not in title, f"{where}: title {title!r}"
        width = self.page.evaluate("document.documentElement.scrollWidth")
        assert width <= WIDTH, f"{where} is {width} px wide in a {WIDTH} px window"
        assert not self.problems, f"{where}: {self.problems}"
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
        return elapsed

    def close(self) -> None:
        self.context.close()


def _html_pages(record, identity: str, server: DaphneServer) -> list[tuple[str, str]]:
    """(route name, path) of every page `identity` may open that is a page (not a file or JSON), asked
    of daphne itself: a request through the test client would write its audit event (a page view) in
    this test's open transaction and hold the chain's lock against daphne."""
    pages = []
    for route in MAIN_ROUTES:
        if route.is_api or EXPECTED[route.name][identity] != 200:
            continue
        path = route_path(route, record)
        request = urllib.request.Request(server.url + path, headers={"Cookie": SESSION_COOKIES[identity]})  # noqa: S310
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
            html = response.headers.get("Content-Type", "").startswith("text/html")
            if html and not response.headers.get("Content-Disposition"):
                pages.append((route.name, path))
    return pages


def _save_times(times: dict[str, float]) -> None:
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    known = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    TIMES.write_text(json.dumps({**known, **times}, indent=1, sort_keys=True))


@pytest.mark.parametrize("identity", ROLES)
def test_every_page_a_role_may_open_renders_cleanly_in_chromium(identity, record, chromium, daphne):
    pages = _html_pages(record, identity, daphne)
    assert len(pages) >= 5, pages
    visit = Visit(chromium, daphne, identity)
    times = {}
    try:
        for name, path in pages:
            times[f"{identity} {path}"] = visit.open(path, f"{identity}-{name.replace(':', '-')}")
    finally:
        visit.close()
    _save_times(times)


def test_every_kind_of_task_renders_cleanly_on_its_pages(record, chromium, daphne):
    visit = Visit(chromium, daphne, "admin")
    times = {}
    try:
        for kind, task_id in record.tasks.items():
            for page, path in (
                ("task", f"/tasks/{task_id}/"),
                ("graph", f"/tasks/{task_id}/graph/"),
                ("dossier", f"/audit/tasks/{task_id}/"),
            ):
                times[f"admin {page} of the {kind} task"] = visit.open(path, f"admin-{page}-{kind}")
    finally:
        visit.close()
    _save_times(times)


def test_a_user_without_a_role_is_told_why_and_can_log_out(record, chromium, daphne, identities):
    from playwright.sync_api import expect

    context = chromium.new_context(base_url=daphne.url, viewport={"width": WIDTH, "height": 900})
    try:
        name, _, value = SESSION_COOKIES["no role"].partition("=")
        context.add_cookies([{"name": name, "value": value, "url": daphne.url}])
        page = context.new_page()
        response = page.goto("/")
        assert response is not None and response.status == 403
        expect(page.locator("form.logout")).to_be_visible()
        expect(page.locator("main")).to_contain_text("grant_role")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "no-role-403.png"), full_page=True)
    finally:
        context.close()
