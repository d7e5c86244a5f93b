"""Who may see and do what: every audit page and export, the task pages and the API, for each role.

The audit and task pages are read from the URL resolver, so a page added later without a role check
fails here (anonymous and role-less users would get in)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from audit.grants import token_create
from audit.models import AuditEvent, LegalHold
from routing.models import SavedView, Task, Worker
from routing.services import TaskSubmission, task_submit

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
WHO = ["anonymous", "no role", "auditor", "operator", "ml_staff", "admin"]
EVERY_ROLE = {"auditor", "operator", "ml_staff", "admin"}
AUDITORS = {"auditor", "admin"}
SUBMITTERS = {"operator", "admin"}
ADMINS = {"admin"}

# Anything under /audit/ (namespaces audit and compliance) is for auditors unless listed here.
AUDIT_EXCEPTIONS = {"compliance:hold": ADMINS, "audit:tokens": EVERY_ROLE}  # tokens: each role, its own
# Task pages are for every role unless listed here.
TASK_EXCEPTIONS = {"routing:task-submit": SUBMITTERS, "routing:task-retry": SUBMITTERS}
# Methods to try per page (GET unless listed).
METHODS = {
    "compliance:hold": ["POST"],
    "audit:verify": ["GET", "POST"],
    "routing:task-submit": ["GET", "POST"],
    "routing:task-retry": ["POST"],  # the task has not failed: refused with a message, on its page
    "routing:view-save": ["POST"],
}
# Values for the URL parameters; a new parameter name must be added here.
SAMPLES = {"task_id": ["<task>"], "fmt": ["csv", "jsonl"], "short_id": ["<short>"], "view_id": ["<view>"]}


@dataclass(frozen=True)
class Route:
    name: str
    kwargs: tuple[tuple[str, str], ...]
    method: str
    allowed: frozenset[str]
    api: bool = False
    path: str = ""

    @property
    def label(self) -> str:
        where = self.path or self.name + "".join(f"[{v}]" for _, v in self.kwargs)
        return f"{self.method} {where}"


def _flat(patterns) -> list[URLPattern]:
    """The patterns of a namespace, with those of the includes inside it that name no namespace of their
    own (an app's features: operations.urls includes one urls module a feature)."""
    flat: list[URLPattern] = []
    for entry in patterns:
        if isinstance(entry, URLPattern):
            flat.append(entry)
        elif not entry.namespace:
            flat += _flat(entry.url_patterns)
    return flat


def _namespace(namespace: str) -> list[URLPattern]:
    """The patterns of `namespace`, wherever it is included (an app may include two namespaces)."""
    resolvers = [e for e in get_resolver().url_patterns if isinstance(e, URLResolver)]
    while resolvers:
        entry = resolvers.pop(0)
        if entry.namespace == namespace:
            return _flat(entry.url_patterns)
        resolvers += [e for e in entry.url_patterns if isinstance(e, URLResolver)]
    raise AssertionError(f"no URL namespace {namespace!r}")


def _expand(pattern: URLPattern) -> list[tuple[tuple[str, str], ...]]:
    combos: list[tuple[tuple[str, str], ...]] = [()]
    # A path's converters, or a regular expression's named groups (re_path).
    for name in pattern.pattern.converters or pattern.pattern.regex.groupindex:
        if name not in SAMPLES:
            raise AssertionError(f"{pattern.name}: add a sample value for the URL parameter {name!r}")
        combos = [(*c, (name, value)) for c in combos for value in SAMPLES[name]]
    return combos


def _pages(namespace: str, default: set[str], exceptions: dict[str, set[str]]) -> list[Route]:
    routes = []
    for pattern in _namespace(namespace):
        name = f"{namespace}:{pattern.name}"
        for kwargs in _expand(pattern):
            for method in METHODS.get(name, ["GET"]):
                routes.append(Route(name, kwargs, method, frozenset(exceptions.get(name, default))))
    return routes


API = [
    Route("api", (), "GET", frozenset(EVERY_ROLE), api=True, path="/api/tasks/"),
    Route("api", (), "POST", frozenset(SUBMITTERS), api=True, path="/api/tasks/"),
    Route("api", (), "GET", frozenset(EVERY_ROLE), api=True, path="/api/tasks/<task>/"),
    Route("api", (), "GET", frozenset(EVERY_ROLE), api=True, path="/api/workers/"),
    Route("api", (), "GET", frozenset(EVERY_ROLE), api=True, path="/api/workers/alpha/"),
]
ROUTES = [
    *_pages("audit", AUDITORS, AUDIT_EXCEPTIONS),
    *_pages("compliance", AUDITORS, AUDIT_EXCEPTIONS),  # the auditors' pages about tasks, under /audit/
    *_pages("routing", EVERY_ROLE, TASK_EXCEPTIONS),
    *API,
]


def test_the_matrix_covers_every_audit_url_the_brief_names():
    labels = {r.label for r in ROUTES}
    for expected in (
        "GET audit:event-log",
        "GET audit:export[csv]",
        "GET audit:export[jsonl]",
        "GET compliance:dossier[<task>]",
        "POST compliance:hold[<task>]",
        "GET compliance:vendors",
        "GET audit:policies",
        "GET audit:verify",
        "GET routing:task-list",
        "GET routing:task-submit",
        "GET routing:worker-list",
    ):
        assert expected in labels


@pytest.fixture
def task(db):
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    return task


@pytest.fixture
def worker(db):
    return Worker.objects.create(
        slug="alpha",
        display_name="Alpha",
        litellm_model="openai/alpha",
        vendor="acme",
        input_usd_per_mtok=1,
        output_usd_per_mtok=2,
    )


def login_as(who: str, make_user, client: Client) -> None:
    if who == "anonymous":
        return
    if who == "admin":
        user = get_user_model().objects.create_superuser("root", password=PASSWORD)
    else:
        user = make_user(who.replace(" ", "-"), *([] if who == "no role" else [who]))
    client.force_login(user)


def shared_view() -> str:
    view, _ = SavedView.objects.get_or_create(name="Queued tasks", shared=True, query="status=queued")
    return str(view.pk)


def call(client: Client, route: Route, task: Task):
    if route.api:
        path = route.path.replace("<task>", str(task.pk))
    else:
        samples = {"<task>": lambda: str(task.pk), "<short>": lambda: str(task.pk)[:8], "<view>": shared_view}
        kwargs = {k: (samples[v]() if v in samples else v) for k, v in route.kwargs}
        path = reverse(route.name, kwargs=kwargs)
    data = {}
    if route.method == "POST":
        if route.name == "compliance:hold":
            data = {"reason": "inquiry 7"}
        elif route.name == "routing:view-save":
            data = {"name": "Queued", "query": "status=queued"}
        elif route.api or route.name == "routing:task-submit":
            data = {"text": "What is 2 + 2?", "classification": "internal"}
    if route.api:
        response = client.post(path, data, format="json") if route.method == "POST" else client.get(path)
    else:
        response = client.post(path, data) if route.method == "POST" else client.get(path)
    if getattr(response, "streaming", False):
        b"".join(response.streaming_content)  # run the export to its end
    return path, response


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.label)
def test_role_matrix(route: Route, who: str, make_user, task, worker):
    client = APIClient() if route.api else Client()
    login_as(who, make_user, client)
    tasks_before, holds_before = Task.objects.count(), LegalHold.objects.count()

    path, response = call(client, route, task)

    if who in route.allowed:
        assert response.status_code in (200, 201, 302), (
            f"{who} was refused {route.label}: {response.status_code}"
        )
        if response.status_code == 302:
            assert "/login/" not in response["Location"]
        return
    if who == "anonymous":
        if route.api:
            assert response.status_code in (401, 403)
        else:
            assert response.status_code == 302
            assert response["Location"].startswith(reverse("login") + "?next=")
    else:
        assert response.status_code == 403, f"{who} got {response.status_code} from {route.label}"
    # A refused request changes nothing.
    assert Task.objects.count() == tasks_before and LegalHold.objects.count() == holds_before


def test_an_allowed_hold_is_placed_and_released_by_an_admin(make_user, task):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password=PASSWORD))
    url = reverse("compliance:hold", kwargs={"task_id": task.pk})

    assert client.post(url, {"reason": "inquiry 7"}).status_code == 302
    hold = LegalHold.objects.get(task_id=task.pk)
    assert hold.reason == "inquiry 7" and hold.placed_by == "root" and hold.released_at is None
    assert client.post(url, {"action": "release"}).status_code == 302
    hold.refresh_from_db()
    assert hold.released_at is not None and hold.released_by == "root"
    assert list(
        AuditEvent.objects.filter(task_id=task.pk, action__startswith="legalhold.").values_list(
            "action", flat=True
        )
    ) == ["legalhold.placed", "legalhold.released"]


# --- API tokens carry a role --------------------------------------------------------------------


def token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_an_api_token_acts_with_its_role_only(make_user, worker):
    both = make_user("ann", "auditor", "operator")
    auditor_token = token_create(user=both, role="auditor", name="reports")
    operator_token = token_create(user=both, role="operator", name="ci")
    body = {"text": "What is 2 + 2?"}

    as_auditor = token_client(auditor_token.key)
    assert as_auditor.get("/api/tasks/").status_code == 200
    assert as_auditor.post("/api/tasks/", body, format="json").status_code == 403
    assert not Task.objects.exists()

    created = token_client(operator_token.key).post("/api/tasks/", body, format="json")
    assert created.status_code == 201
    assert Task.objects.get().submitted_by == both

    # The same user logged in (no token) holds both roles.
    session = APIClient()
    session.force_login(both)
    assert session.post("/api/tasks/", {"text": "What is 3 + 3?"}, format="json").status_code == 201


def test_a_token_cannot_carry_a_role_its_user_lacks_and_a_revoked_token_is_refused(make_user):
    from django.utils import timezone

    ann = make_user("ann", "auditor")
    with pytest.raises(ValueError, match="does not hold the role"):
        token_create(user=ann, role="operator")
    token = token_create(user=ann, role="auditor")
    assert token_client(token.key).get("/api/tasks/").status_code == 200
    token.revoked_at = timezone.now()
    token.save()
    assert token_client(token.key).get("/api/tasks/").status_code in (401, 403)
    assert token_client("not-a-token").get("/api/tasks/").status_code in (401, 403)


def test_a_token_loses_its_power_when_its_user_loses_the_role(make_user):
    from audit.grants import user_set_roles

    ann = make_user("ann", "operator")
    token = token_create(user=ann, role="operator")
    user_set_roles(user=ann, roles=["auditor"])
    response = token_client(token.key).post("/api/tasks/", {"text": "What is 2 + 2?"}, format="json")
    assert response.status_code == 403
    assert not Task.objects.exists()


# --- logins, logouts and record views are audited ---------------------------------------------


def test_login_logout_and_failed_logins_are_audit_events(make_user):
    ann = make_user("ann", "auditor")
    client = Client(REMOTE_ADDR="10.1.2.3")

    assert client.post("/login/", {"username": "ann", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "nobody", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 302
    assert client.post("/logout/").status_code == 302

    events = list(AuditEvent.objects.filter(action__startswith="auth.").order_by("id"))
    assert [e.action for e in events] == [
        "auth.login_failed",
        "auth.login_failed",
        "auth.login",
        "auth.logout",
    ]
    assert all(e.chain == "global" and e.actor_type == "user" for e in events)
    failed_known, failed_unknown, login, logout = events
    assert failed_known.actor_name == "ann" and failed_known.actor_id == str(ann.pk)
    assert failed_known.payload == {"ip": "10.1.2.3", "username": "ann", "known_user": True, "failures": 1}
    assert "password" not in str(failed_known.payload)
    assert failed_unknown.actor_name == "nobody" and failed_unknown.actor_id == ""
    assert failed_unknown.payload["known_user"] is False
    for event in (login, logout):
        assert (event.actor_name, event.object_type, event.object_id) == ("ann", "user", str(ann.pk))
        assert event.payload == {"ip": "10.1.2.3"}


def test_viewing_a_dossier_writes_record_viewed_and_a_refused_view_does_not(make_user, task):
    auditor, operator = make_user("ann", "auditor"), make_user("bob", "operator")
    url = reverse("compliance:dossier", kwargs={"task_id": task.pk})
    refused = Client()
    refused.force_login(operator)
    assert refused.get(url).status_code == 403
    assert not AuditEvent.objects.filter(action="record.viewed").exists()

    client = Client()
    client.force_login(auditor)
    assert client.get(url).status_code == 200
    assert client.get(url + "?download=1").status_code == 200

    views = list(AuditEvent.objects.filter(action="record.viewed").order_by("id"))
    assert [e.payload["view"] for e in views] == ["dossier", "dossier export"]
    for event in views:
        assert event.task_id == task.pk and event.actor_name == "ann" and event.chain == "global"
        assert (event.object_type, event.object_id) == ("task", str(task.pk))
