"""The acceptance sweep: every route x every kind of user, on the record the real engine made, then
the same routes with hostile query strings and bodies. Any 5xx fails; any status other than the
access table's fails; a filter a page reads but cannot apply must be refused (400), never dropped.

The access table below is the one in docs/audit.md ("Who may open what"); a test keeps them equal.
Cells: a status code, or "login" (a redirect to the login page).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client

from audit import signing
from audit.bundle import verify_bundle
from tests.acceptance.conftest import SESSION_COOKIES
from tests.acceptance.crawl import IDENTITIES, Route, fill, markdown_table, routes

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def _row(anonymous, no_role, auditor, operator, ml_staff, admin) -> dict[str, int | str]:
    return dict(zip(IDENTITIES, (anonymous, no_role, auditor, operator, ml_staff, admin), strict=True))


EVERYONE = _row("login", 403, 200, 200, 200, 200)
EVERYONE_API = _row(403, 403, 200, 200, 200, 200)
AUDITORS = _row("login", 403, 200, 403, 403, 200)
OPERATORS = _row("login", 403, 403, 200, 403, 200)
TRAINING_READERS = _row("login", 403, 200, 403, 200, 200)
TRAINING_READERS_API = _row(403, 403, 200, 403, 200, 200)
AUDITORS_API = _row(403, 403, 200, 403, 403, 200)
TRAINING_ACTION_API = _row(403, 403, 405, 403, 405, 405)  # POST actions, read by GET: allowed readers get 405
EVERYONE_ACTION_API = _row(403, 403, 405, 405, 405, 405)  # a POST action any role may read by GET: 405
POST_ONLY = _row(405, 405, 405, 405, 405, 405)
OPEN = _row(200, 200, 200, 200, 200, 200)
TO_STATIC = _row(302, 302, 302, 302, 302, 302)  # a redirect to a static file
REVIEWERS = _row("login", 403, 200, 403, 200, 200)
PLAYERS = _row("login", 403, 403, 200, 200, 200)
TRAINING_WRITERS = _row("login", 403, 403, 403, 200, 200)
EVERYONE_TO_PAGE = _row("login", 403, 302, 302, 302, 302)  # a short address of a page any role reads

# The access table (GET). Mirrors docs/audit.md; the format-suffixed twins of API routes
# (`/api/tasks.json`) answer as their route does.
EXPECTED: dict[str, dict[str, int | str]] = {
    "routing:task-list": EVERYONE,
    "routing:view-save": POST_ONLY,
    "routing:view-open": EVERYONE_TO_PAGE,
    "routing:task-submit": OPERATORS,
    "routing:task-detail": EVERYONE,
    "routing:task-short": EVERYONE_TO_PAGE,
    "routing:task-graph": EVERYONE,
    "routing:task-retry": POST_ONLY,
    "routing:run-compare": EVERYONE,
    "routing:worker-list": EVERYONE,
    "routing:attempt-list": EVERYONE,
    "routing:ops": EVERYONE,
    "routing:analytics": EVERYONE,
    "review:queue": REVIEWERS,
    "playground:page": PLAYERS,
    "review:annotate": POST_ONLY,
    "annotation-list": EVERYONE_API,
    "training-api:job-list": TRAINING_READERS_API,
    "training-api:job-detail": TRAINING_READERS_API,
    "training-api:job-cancel": TRAINING_ACTION_API,
    "training-api:job-metrics": TRAINING_READERS_API,
    "training-api:dataset-list": TRAINING_READERS_API,
    "training-api:dataset-detail": TRAINING_READERS_API,
    "training-api:dataset-file": TRAINING_READERS_API,
    "training-api:rollout-list": TRAINING_READERS_API,
    "training-api:rollout-detail": TRAINING_READERS_API,
    "training-api:evaluation-list": TRAINING_READERS_API,
    "training-api:evaluation-detail": TRAINING_READERS_API,
    "training-api:conductor-list": TRAINING_READERS_API,
    "training-api:conductor-rollback": TRAINING_ACTION_API,
    "training-api:conductor-detail": TRAINING_READERS_API,
    "training-api:conductor-promote": TRAINING_ACTION_API,
    "training-api:conductor-shadow": TRAINING_ACTION_API,
    "training-api:api-root": TRAINING_READERS_API,
    "task-list": EVERYONE_API,
    "task-detail": EVERYONE_API,
    "task-retry": EVERYONE_ACTION_API,
    "worker-list": EVERYONE_API,
    "worker-detail": EVERYONE_API,
    "run-compare": EVERYONE_API,
    "api-root": EVERYONE_API,
    "audit-api:event-list": AUDITORS_API,
    "audit-api:export-jsonl": AUDITORS_API,
    "audit-api:export-csv": AUDITORS_API,
    "audit-api:policies": AUDITORS_API,
    "audit-api:verify": AUDITORS_API,
    "audit-api:public-key": AUDITORS_API,
    "audit-api:log-checkpoint": AUDITORS_API,
    "audit-api:log-consistency": AUDITORS_API,
    "compliance-api:vendors": AUDITORS_API,
    "compliance-api:dossier": AUDITORS_API,
    "compliance-api:log-inclusion": AUDITORS_API,
    "audit:event-log": AUDITORS,
    "audit:export": AUDITORS,
    "compliance:dossier": AUDITORS,
    "compliance:hold": POST_ONLY,
    "compliance:vendors": AUDITORS,
    "audit:policies": AUDITORS,
    "audit:verify": AUDITORS,
    "audit:public-key": AUDITORS,
    "audit:tokens": EVERYONE,
    "training:home": TRAINING_READERS,
    "training:job-start": POST_ONLY,
    "training:job": TRAINING_READERS,
    "training:job-progress": TRAINING_READERS,
    "training:job-cancel": POST_ONLY,
    "training:job-artifact": TRAINING_READERS,
    "training:rollouts-start": POST_ONLY,
    "training:dataset-build": POST_ONLY,
    "training:dataset": TRAINING_READERS,
    "training:dataset-file": TRAINING_READERS,
    "training:evaluation": TRAINING_READERS,
    "training:rollback": POST_ONLY,
    "training:promote": POST_ONLY,
    "training:shadow": POST_ONLY,
    "training:evaluate": POST_ONLY,
    "training:itemsets": TRAINING_READERS,
    "training:itemset-upload": POST_ONLY,
    "training:itemset-template": TRAINING_READERS,
    "training:itemset-add-task": TRAINING_WRITERS,
    "training:itemset-add-view": POST_ONLY,
    "training:itemset": TRAINING_READERS,
    "training:itemset-export": TRAINING_READERS,
    "training:itemset-manifest": TRAINING_READERS,
    "training-api:itemset-list": TRAINING_READERS_API,
    "training-api:itemset-detail": TRAINING_READERS_API,
    "training-api:itemset-tasks": TRAINING_ACTION_API,
    "training-api:itemset-items": TRAINING_READERS_API,
    "training-api:itemset-manifest": TRAINING_READERS_API,
    "training-api:itemset-export": TRAINING_READERS_API,
    "schema": EVERYONE_API,
    "api-docs": EVERYONE_API,
    "api-redoc": EVERYONE_API,
    "api-redoc-bundle": OPEN,  # a static file, served with one foreign address taken out
    "login": OPEN,
    "favicon": TO_STATIC,
    "metrics": OPEN,  # from loopback, as the test client asks; a token or loopback otherwise
    "logout": POST_ONLY,
}

# The query parameters pages and endpoints read, by kind; a route reading one not listed fails the
# sweep (add it here, with its kind, so that its hostile values are tried).
PARAM_KINDS: dict[str, str] = {
    "since": "date",
    "until": "date",
    "status": "enum",
    "classification": "enum",
    "chart": "enum",
    "bucket": "enum",
    "conductor": "enum",
    "stop": "enum",
    "q": "text",
    "source": "enum",
    "period": "enum",
    "worker": "enum",
    "action": "text",
    "actor": "text",
    "chain": "text",
    "object_type": "text",
    "vendor": "text",
    "task": "uuid",
    "run": "run id",  # the runs compared: each a run's id, 2 to 4 of them
    "minutes": "int",
    "after": "int",
    "from": "tree size",  # of a tree an auditor kept
    "to": "tree size",
    "page_size": "int",
    "state": "enum",
    "kind": "enum",
    "score": "enum",
    "verdict": "enum",
    "mode": "enum",
    "instruction": "prefill",  # the playground's instruction: any text is one to edit
    "step": "int",
    "label": "text",
    "set_version": "enum",  # an item set's version number; none that is not one
    "split": "enum",
    "format": "not found",  # DRF: a renderer it does not have
    "cursor": "not found",  # DRF: a page it did not issue
    # Not filters: what they select is shown as such, and a value they cannot use is ignored.
    "partial": "flag",  # any value: the overview's auto-refreshed body
    "download": "enum",  # the dossier as a file: html (or 1) or pdf
    "sample": "prefill",  # the submit form's sample task; an unknown one prefills nothing
    "next": "prefill",  # where to go after logging in; Django ignores a foreign or odd one
    "version": "flag",  # the schema's API version: there is one, whatever is asked
    "lang": "flag",  # the schema's language, passed on by the API docs: there is one, whatever is asked
    "script": "flag",  # any value: Swagger UI's start-up script instead of its page (no inline script)
}

HOSTILE: dict[str, list[str]] = {
    "not found": ["no-such-value"],
    "flag": ["", "0", "x" * 600],
    "prefill": ["no-such-value", "9" * 40, "-1", "x" * 600],
    "date": ["2026-13-45", "2026-02-30", "2026-01-01T25:00", "2026-01-01T10:00+99:00", "yesterday", "9" * 30],
    "enum": ["no-such-value", "x" * 600],
    "int": ["abc", "9" * 40, "-99", "1e9"],
    "text": ["x" * 600, "a\x01b"],
    "uuid": ["not-a-uuid", "zz" * 18],
    "run id": ["abc", "9" * 40, "-99", "1e9", "0"],
    "tree size": ["abc", "9" * 40, "-99", "1e9", "999999999"],  # the last: more leaves than the log has
}
NUL_VALUES = ["\x00", "a\x00b", "2026-01-01\x00"]
# Names no route reads: refused (400, naming them) wherever a GET answers, as a bad value is, never
# ignored (utilities.params.AskedQuery); `range` and `author` are the ones people tried.
UNKNOWN_PARAMS = ["zz", "range", "author"]
# Values a route must accept (200): a valid date, not only invalid ones, reaches the parsing.
VALID: dict[str, list[str]] = {
    "tree size": ["1"],  # the record's log holds a leaf at least
    "date": ["2026-01-01", "2026-01-01T10:00", "2026-01-01T10:00:00+02:00"],
    "int": ["5"],
    "text": ["a"],
    "uuid": ["00000000-0000-4000-8000-000000000000"],
}


# --- Users ----------------------------------------------------------------------------------------


def session_client(identities, identity: str) -> Client:
    client = Client()
    user = identities[identity][0]
    if user is not None:
        client.force_login(user)
    return client


def token_client(identities, identity: str) -> Client:
    key = identities[identity][1]
    return Client(HTTP_AUTHORIZATION=f"Token {key}") if key else Client()


# --- Filling routes from the record ---------------------------------------------------------------


def path_values(route: Route, record) -> dict[str, str]:
    version_names = _version_names(record)
    values = {
        "task_id": str(record.tasks["static"]),
        "short_id": str(record.tasks["static"])[:8],
        "run_id": str(_first_run_of(record.tasks["static"])),
        "pk": str(record.tasks["static"]),
        "job_id": str(record.jobs["finished"]),
        "dataset_id": str(record.dataset_id),
        "evaluation_id": str(record.evaluation_id),
        "version_id": str(record.versions["candidate"]),
        "fmt": "csv",
        "slug": record.worker_slugs[0],
        "format": "json",
    }
    if route.name.startswith("training-api:job"):
        values["pk"] = str(record.jobs["finished"])
    elif route.name.startswith("training-api:dataset"):
        values["pk"] = str(record.dataset_id)
        values["name"] = record.dataset_files[0]
    elif route.name.startswith("training-api:rollout"):
        values["pk"] = str(record.rollout_batch_id)
    elif route.name.startswith("training-api:evaluation"):
        values["pk"] = str(record.evaluation_id)
    elif route.name.startswith("training-api:conductor"):
        values["name"] = version_names["candidate"]
    elif route.name == "training:job-artifact":
        values["name"] = record.job_artifacts[record.jobs["finished"]][0]
    elif route.name == "training:dataset-file":
        values["name"] = record.dataset_files[0]
    if route.name.startswith(("training:itemset", "training-api:itemset")):
        values["name"] = record.item_set
    if "view_id" in route.params:
        values["view_id"] = str(_shared_view_id())
    missing = [p for p in route.params if p not in values]
    assert not missing, f"the sweep cannot fill {missing} of {route.name}: add them to path_values()"
    return values


def _first_run_of(task_id) -> int:
    from routing.models import Run

    return Run.objects.filter(task_id=task_id).order_by("pk").values_list("pk", flat=True)[0]


def _version_names(record) -> dict[str, str]:
    from routing.models import ConductorVersion

    return {k: ConductorVersion.objects.get(pk=pk).name for k, pk in record.versions.items()}


def route_query(route: Route, record) -> str:
    """The query string a route needs to show what it is for: the compare routes compare the shadowed
    task's live run with its shadow run."""
    if route.name in ("routing:run-compare", "run-compare"):
        return urlencode([("run", record.runs["shadowed"]), ("run", record.runs["shadow"])])
    return ""


def _shared_view_id() -> int:
    """A view of the task list shared with everyone who reads tasks."""
    from routing.models import SavedView

    view, _ = SavedView.objects.get_or_create(name="Queued tasks", shared=True, query="status=queued")
    return view.pk


def route_path(route: Route, record) -> str:
    path = fill(route, path_values(route, record))
    query = route_query(route, record)
    return f"{path}?{query}" if query else path


def outcome(response) -> int | str:
    if response.status_code == 302 and response["Location"].startswith("/login/"):
        return "login"
    return response.status_code


def read(response) -> bytes:
    """The whole body (a streamed export is read to its end: it must end)."""
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return response.content


ALL_ROUTES = routes()
MAIN_ROUTES = [r for r in ALL_ROUTES if not r.format_suffix]


# --- The role matrix ------------------------------------------------------------------------------


def test_the_access_table_names_every_route():
    assert sorted({r.name for r in MAIN_ROUTES}) == sorted(EXPECTED)


def test_docs_carry_the_same_access_table():
    docs = (ROOT / "docs" / "audit.md").read_text()
    for line in markdown_table(EXPECTED):
        assert line in docs, f"docs/audit.md lacks the access table line: {line}"


def observe(route: Route, record, identities) -> dict[str, int | str]:
    """What each identity gets, by session; tokens are checked against it."""
    path = route_path(route, record)
    seen: dict[str, int | str] = {}
    for identity in IDENTITIES:
        response = session_client(identities, identity).get(path)
        read(response)
        assert response.status_code < 500, f"{path} as {identity}: {response.status_code}"
        seen[identity] = outcome(response)
    return seen


@pytest.mark.parametrize("route", MAIN_ROUTES, ids=lambda r: r.name)
def test_every_route_answers_every_identity_as_the_table_says(route, record, identities):
    seen = observe(route, record, identities)
    assert seen == EXPECTED[route.name], f"{route.name}: seen {seen}"
    path = route_path(route, record)
    for identity in IDENTITIES[1:]:
        response = token_client(identities, identity).get(path)
        read(response)
        assert response.status_code < 500
        # A token opens the API with its role; pages know sessions only (a token there is anonymous).
        want = seen[identity] if route.is_api and identities[identity][1] else seen["anonymous"]
        assert outcome(response) == want, f"{path} by {identity}'s token"


# Names that may themselves hold a dot (a file name, a version name): `<name>.json` reads as the name.
DOTTED_NAMES = {"training-api:dataset-file", "training-api:conductor-detail"}


@pytest.mark.parametrize(
    "route",
    [r for r in ALL_ROUTES if r.format_suffix and r.name not in DOTTED_NAMES],
    ids=lambda r: r.pattern,
)
def test_format_suffixed_twins_answer_as_their_route(route, record, identities):
    twin = EXPECTED[route.name]
    for identity in ("anonymous", "auditor", "admin"):
        response = session_client(identities, identity).get(route_path(route, record))
        read(response)
        assert outcome(response) == twin[identity], f"{route.pattern} as {identity}"


TASK_ROUTES = [r for r in MAIN_ROUTES if "task_id" in r.params or r.name == "task-detail"]


@pytest.mark.parametrize("route", TASK_ROUTES, ids=lambda r: r.name)
def test_every_kind_of_task_opens_on_every_task_route(route, record, identities):
    client = session_client(identities, "admin")
    for kind, task_id in record.tasks.items():
        path = fill(route, {**path_values(route, record), "task_id": str(task_id), "pk": str(task_id)})
        response = client.get(path)
        read(response)
        assert outcome(response) == EXPECTED[route.name]["admin"], f"{route.name} of the {kind} task"


def test_every_task_dossier_exports(record, identities):
    client = session_client(identities, "auditor")
    for kind, task_id in record.tasks.items():
        response = client.get(f"/audit/tasks/{task_id}/", {"download": "1"})
        assert response.status_code == 200, f"dossier export of the {kind} task"
        assert response["Content-Disposition"].startswith("attachment;")
        pdf = client.get(f"/audit/tasks/{task_id}/", {"download": "pdf"})
        assert pdf.status_code == 200, f"dossier PDF of the {kind} task: {pdf.content[:300]!r}"
        assert pdf["Content-Type"] == "application/pdf" and pdf.content.startswith(b"%PDF-")
        bundle = client.get(f"/audit/tasks/{task_id}/", {"download": "bundle"})
        assert bundle.status_code == 200, f"dossier bundle of the {kind} task"
        # Its chains, seals and values hold; only the checkpoint may be missing (beat does not run here).
        problems = verify_bundle(json.loads(bundle.content), signing.public_key())
        assert all("no signed checkpoint covers" in p for p in problems), (kind, problems)


def test_the_websocket_admits_the_roles_the_task_page_admits(record, identities):
    from conductor_web.asgi import application

    task_id = record.tasks["static"]
    for identity in IDENTITIES:
        cookie = SESSION_COOKIES.get(identity, "")

        async def connect(cookie=cookie):
            headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
            if cookie:
                headers.append((b"cookie", cookie.encode()))
            communicator = WebsocketCommunicator(application, f"/ws/tasks/{task_id}/", headers=headers)
            connected, code = await communicator.connect(timeout=10)
            await communicator.disconnect()
            return connected, code

        # In a thread of its own: the consumer's database calls run there, on a connection of their own
        # (channels closes it after each call), not on this test's, which holds an open transaction.
        result: list = []
        thread = threading.Thread(
            target=lambda connect=connect, result=result: result.append(async_to_sync(connect)())
        )
        thread.start()
        thread.join(30)
        connected, code = result[0]
        may = EXPECTED["routing:task-detail"][identity] == 200
        assert connected is may, f"websocket as {identity}: connected={connected} code={code}"


# --- Hostile input --------------------------------------------------------------------------------


@pytest.fixture
def recording(settings):
    settings.MIDDLEWARE = ["tests.acceptance.crawl.RecordQueryParameters", *settings.MIDDLEWARE]


def _query(path: str, name: str, value: str) -> str:
    """`path` with name=value added to its query string."""
    return f"{path}{'&' if '?' in path else '?'}{quote(name)}={quote(value, safe='')}"


@pytest.mark.parametrize("route", MAIN_ROUTES, ids=lambda r: r.name)
def test_hostile_query_strings_are_refused_with_a_reason(route, record, identities, recording):
    client = session_client(identities, "admin")
    path = route_path(route, record)
    plain = client.get(path)
    read(plain)
    asked = set(getattr(plain, "asked_params", set()))
    unknown = asked - set(PARAM_KINDS)
    assert not unknown, f"{route.name} reads {sorted(unknown)}: add them to PARAM_KINDS with their kind"
    for name in sorted(asked | {"zz"}):
        for value in NUL_VALUES:
            response = client.get(_query(path, name, value))
            read(response)
            assert response.status_code == 400, f"{path}?{name}={value!r}: {response.status_code}"
    if plain.status_code != 200:
        return  # a route that refuses a GET reads no filter
    for name in UNKNOWN_PARAMS:
        response = client.get(_query(path, name, "1"))
        body = read(response)
        assert response.status_code == 400, f"{path}?{name}=1 (read by no route): {response.status_code}"
        assert f"'{name}' is not a query parameter".encode() in body.replace(b"&#x27;", b"'"), body[:300]
    for name in sorted(asked):
        kind = PARAM_KINDS[name]
        for value in HOSTILE[kind]:
            response = client.get(_query(path, name, value))
            body = read(response)
            where = f"{path}?{name}={value[:40]!r}: {response.status_code}"
            if kind in ("flag", "prefill"):
                assert response.status_code == 200, where
            elif kind == "not found":
                assert response.status_code == 404, where
            else:
                assert response.status_code == 400, where
                assert name.encode() in body, f"{path}?{name}=...: the 400 does not name the parameter"
        for value in VALID.get(kind, []):
            response = client.get(_query(path, name, value))
            read(response)
            assert response.status_code == 200, f"{path}?{name}={value!r}: {response.status_code}"


LONG_ID = "9" * 30


@pytest.mark.parametrize("route", [r for r in MAIN_ROUTES if r.params], ids=lambda r: r.name)
def test_hostile_ids_in_paths_are_not_found(route, record, identities):
    client = session_client(identities, "admin")
    for param in route.params:
        if param == "format":
            continue
        for value in (LONG_ID, "0", "abc", "x" * 300):
            try:
                path = fill(route, {**path_values(route, record), param: value})
            except KeyError:
                continue
            response = client.get(path)
            read(response)
            assert response.status_code in (400, 404, 405), f"{path}: {response.status_code}"


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("route", [r for r in MAIN_ROUTES if r.is_api], ids=lambda r: r.name)
def test_hostile_json_bodies_are_refused_with_a_reason(route, record, identities):
    client = session_client(identities, "admin")
    path = route_path(route, record)
    bodies = {
        "deep": '{"text": ' + _deep(100_000) + "}",
        "deep-but-parseable": '{"text": ' + _deep(200) + "}",
        "nul": json.dumps({"text": "a\x00b", "config": {"x": "\x00"}, "name": "n\x00"}),
        "not-json": "{'text': 1",
    }
    for label, body in bodies.items():
        response = client.post(path, body, content_type="application/json")
        read(response)
        # 400 where the body is read; 405 where POST is not taken; an action that reads no body
        # (rollback, promote) just acts.
        assert response.status_code in (200, 400, 405), f"POST {path} ({label}): {response.status_code}"
        if response.status_code == 400:
            assert "detail" in response.json(), f"POST {path} ({label}): {response.content[:200]!r}"


@pytest.mark.parametrize("route", [r for r in MAIN_ROUTES if not r.is_api], ids=lambda r: r.name)
def test_hostile_form_bodies_never_fail_the_server(route, record, identities):
    client = session_client(identities, "admin")
    path = route_path(route, record)
    form = {
        name: "a\x00b"
        for name in ("text", "reference", "reason", "name", "action", "items", "split", "config", "max_usd")
    }
    response = client.post(path, form)
    read(response)
    assert response.status_code < 500, f"POST {path}: {response.status_code}"
    response = client.post(
        path, b"text=%FF%FE&reason=%C0%80", content_type="application/x-www-form-urlencoded"
    )
    read(response)
    assert response.status_code < 500, f"POST {path} (not UTF-8): {response.status_code}"


# --- Who may post ---------------------------------------------------------------------------------

# Routes that change something, and who may post to them (admins always may). Everyone else is sent
# to log in (pages, when anonymous) or refused (403). What an allowed post does is each feature's own
# test; here it must only not be refused and not fail.
MAY_POST: dict[str, tuple[str, ...]] = {
    "routing:task-submit": ("operator",),
    "task-list": ("operator",),
    "routing:view-save": ("auditor", "operator", "ML staff"),
    "compliance:hold": (),
    "audit:verify": ("auditor",),
    "audit:tokens": ("auditor", "operator", "ML staff"),  # each their own tokens
    "training:job-start": ("ML staff",),
    "training:job-cancel": ("ML staff",),
    "training:rollouts-start": ("ML staff",),
    "training:dataset-build": ("ML staff",),
    "training:rollback": ("ML staff",),
    "training:promote": ("ML staff",),
    "training:shadow": ("ML staff",),
    "training:evaluate": ("ML staff",),
    "training-api:job-list": ("ML staff",),
    "training-api:job-cancel": ("ML staff",),
    "training-api:dataset-list": ("ML staff",),
    "training-api:rollout-list": ("ML staff",),
    "training-api:evaluation-list": ("ML staff",),
    "training-api:conductor-rollback": ("ML staff",),
    "training-api:conductor-promote": ("ML staff",),
    "training-api:conductor-shadow": ("ML staff",),
    "training:itemset-upload": ("ML staff",),
    "training:itemset-add-task": ("ML staff",),
    "training:itemset-add-view": ("ML staff",),
    "training-api:itemset-list": ("ML staff",),
    "training-api:itemset-tasks": ("ML staff",),
}


@pytest.mark.parametrize("name", sorted(MAY_POST))
def test_only_the_roles_that_may_change_something_can_post(name, record, identities):
    route = next(r for r in MAIN_ROUTES if r.name == name)
    path = route_path(route, record)
    for identity in IDENTITIES:
        client = session_client(identities, identity)
        if route.is_api:
            response = client.post(path, "{}", content_type="application/json")
        else:
            response = client.post(path, {})
        read(response)
        assert response.status_code < 500, f"POST {path} as {identity}: {response.status_code}"
        if identity == "admin" or identity in MAY_POST[name]:
            assert outcome(response) not in ("login", 403, 405), f"POST {path} as {identity}: refused"
        elif identity == "anonymous" and not route.is_api:
            assert outcome(response) == "login", f"POST {path} as anonymous"
        else:
            assert response.status_code == 403, f"POST {path} as {identity}: {response.status_code}"
