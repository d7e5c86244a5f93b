"""The HTML pages through Django's test client, and the submit_task management command."""

from __future__ import annotations

import io
import json
import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from accounts.models import Role
from audit.models import AuditEvent
from routing import engine
from routing.models import Run, Step, Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import program_recursion

pytestmark = pytest.mark.django_db(transaction=True)

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture
def user(make_user):
    return make_user("grace", Role.OPERATOR, password="correct horse battery")


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def client(user) -> Client:
    return logged_in(user)


def submit(text: str) -> Task:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)
    return task


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


# --- login ------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/", "/tasks/new/", "/workers/", f"/tasks/{uuid.uuid4()}/"])
def test_pages_require_login(url):
    response = Client().get(url)

    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={url}"


def test_the_login_page_logs_in(user):
    client = Client()
    assert client.get("/login/").status_code == 200

    response = client.post("/login/", {"username": "grace", "password": "correct horse battery"})

    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


# --- roles ------------------------------------------------------------------------------------


SUBMIT_LINK = 'href="/tasks/new/"'


def read_urls(task: Task) -> list[str]:
    return ["/", "/workers/", f"/tasks/{task.pk}/"]


def test_a_user_without_a_role_gets_403_on_every_page(make_user):
    task = submit("What is 2 + 2?")
    client = logged_in(make_user("nobody"))

    for url in [*read_urls(task), "/tasks/new/"]:
        assert client.get(url).status_code == 403, url
    assert client.post("/tasks/new/", FORM).status_code == 403
    assert list(Task.objects.values_list("text", flat=True)) == ["What is 2 + 2?"]
    assert not AuditEvent.objects.filter(action="record.viewed").exists()


@pytest.mark.parametrize("role", Role.values)
def test_every_role_may_read_the_pages(make_user, role):
    task = submit("What is 2 + 2?")
    client = logged_in(make_user("reader", role))

    assert "What is 2 + 2?" in page(client, "/")
    assert "What is 2 + 2?" in page(client, f"/tasks/{task.pk}/")
    assert "Worker pool" in page(client, "/workers/")
    assert AuditEvent.objects.get(action="record.viewed").actor_name == "reader"


def test_an_auditor_may_read_but_not_submit(make_user):
    task = submit("What is 2 + 2?")
    client = logged_in(make_user("ann", Role.AUDITOR))

    assert "What is 2 + 2?" in page(client, f"/tasks/{task.pk}/")
    assert client.get("/tasks/new/").status_code == 403
    assert client.post("/tasks/new/", FORM).status_code == 403
    assert list(Task.objects.values_list("text", flat=True)) == ["What is 2 + 2?"]
    assert AuditEvent.objects.filter(action="task.submitted").count() == 1


@pytest.mark.parametrize(
    ("role", "may_submit"),
    [(Role.OPERATOR, True), (Role.ADMIN, True), (Role.AUDITOR, False), (Role.ML_STAFF, False)],
)
def test_the_submit_links_show_only_to_roles_that_may_submit(make_user, role, may_submit):
    client = logged_in(make_user("someone", role))

    nav = page(client, "/workers/").split("<nav>")[1].split("</nav>")[0]
    assert ('href="/workers/"' in nav) and ('href="/"' in nav)
    assert (SUBMIT_LINK in nav) == may_submit
    # Nor does the task list offer a form the user would be refused (empty list and full list).
    assert (SUBMIT_LINK in page(client, "/")) == may_submit
    submit("What is 2 + 2?")
    assert (SUBMIT_LINK in page(client, "/")) == may_submit
    assert client.get("/tasks/new/").status_code == (200 if may_submit else 403)


def test_a_superuser_is_an_admin_and_may_submit_through_the_form():
    root = get_user_model().objects.create_superuser("root", email="", password="y" * 12)
    client = logged_in(root)

    assert SUBMIT_LINK in page(client, "/")
    response = client.post("/tasks/new/", FORM)

    task = Task.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/tasks/{task.pk}/"
    assert task.submitted_by == root


# --- task list --------------------------------------------------------------------------------


def test_an_empty_task_list_says_so(client):
    html = page(client, "/")

    assert "No tasks yet." in html
    assert '<table class="data">' not in html


def test_the_task_list_shows_tasks_and_filters_them(client):
    submit("Translate hello to French")
    submit("Sum 2 and 3")

    html = page(client, "/")
    assert "Translate hello to French" in html and "Sum 2 and 3" in html
    assert "No tasks" not in html

    filtered = page(client, "/?q=translate")
    assert "Translate hello to French" in filtered and "Sum 2 and 3" not in filtered

    none = page(client, "/?status=failed")
    assert "No tasks match these filters." in none


def test_the_older_tasks_link_skips_no_task_created_at_the_same_moment_as_the_last_shown(client):
    from django.utils import timezone

    from operations.tasks.pagination import CreatedCursorPagination

    tasks = [submit(f"Task number {i}") for i in range(CreatedCursorPagination.page_size + 3)]
    # Every task at one moment: the page boundary falls between tasks with equal created_at.
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(created_at=timezone.now())
    seen: list[str] = []
    url = "/"
    for _ in range(3):
        response = client.get(url)
        assert response.status_code == 200
        seen += [str(t.pk) for t in response.context["tasks"]]
        if not response.context["next_page"]:
            break
        url = "/" + response.context["next_page"]
    assert len(seen) == len(tasks) and url != "/"  # more than one page
    assert sorted(seen) == sorted(str(t.pk) for t in tasks)  # each once, none skipped
    assert len(seen) == len(set(seen))


# --- submit form ------------------------------------------------------------------------------


FORM = {
    "text": "What is 6 * 7?",
    "reference": "42",
    "scorer": "numeric",
    "classification": "internal",
    "max_steps": "4",
    "max_depth": "1",
    "max_usd": "0.50",
    "idempotency_key": "",
}


def test_the_submit_form_renders(client):
    html = page(client, "/tasks/new/")

    assert 'name="text"' in html and 'name="max_usd"' in html and "csrfmiddlewaretoken" in html


def test_the_submit_form_creates_a_task_and_redirects_to_it(client, user):
    response = client.post("/tasks/new/", FORM)

    task = Task.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/tasks/{task.pk}/"
    assert task.text == "What is 6 * 7?" and task.reference == "42" and task.scorer == "numeric"
    assert (task.max_steps, task.max_depth, str(task.max_usd)) == (4, 1, "0.5000000000")
    assert task.source == Task.Source.WEB and task.submitted_by == user
    assert task.idempotency_key is None
    assert task.runs.count() == 1
    assert AuditEvent.objects.filter(action="task.submitted", task_id=task.pk).count() == 1


def test_the_submit_form_with_a_used_key_shows_the_existing_task(client):
    first = client.post("/tasks/new/", {**FORM, "idempotency_key": "web-1"})

    again = client.post("/tasks/new/", {**FORM, "idempotency_key": "web-1"}, follow=True)

    assert Task.objects.count() == 1
    assert again.redirect_chain == [(first["Location"], 302)]
    assert "already exists; showing it" in again.content.decode()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"idempotency_key": "web-2", "text": "Something else"}, "already used for a different task"),
        ({"text": "   "}, "This field is required."),
        ({"max_usd": "-1"}, "greater than or equal to 0"),
    ],
    ids=["conflict", "blank", "negative-usd"],
)
def test_the_submit_form_shows_errors_and_creates_nothing(client, change, message):
    client.post("/tasks/new/", {**FORM, "idempotency_key": "web-2"})
    before = Task.objects.count()

    response = client.post("/tasks/new/", {**FORM, **change})

    assert response.status_code == 200
    assert message in response.content.decode()
    assert Task.objects.count() == before


def test_the_submit_form_refuses_an_oversized_text(client, settings):
    settings.CONDUCTOR_MAX_TASK_CHARS = 100

    response = client.post("/tasks/new/", {**FORM, "text": "x" * 101})

    assert response.status_code == 200
    assert "At most 100 characters." in response.content.decode()
    assert not Task.objects.exists()


# --- task page --------------------------------------------------------------------------------


def test_the_task_page_shows_steps_workers_and_costs(client, live_pool):
    server = live_pool["server"]
    server.program(
        "conductor", [Reply(plan_json(("alpha", "Draft an answer", []), ("gamma", "Check the draft", "all")))]
    )
    server.program("alpha", [Reply("draft: 42", prompt_tokens=100, completion_tokens=20)])
    server.program("gamma", [Reply("final: 42", prompt_tokens=200, completion_tokens=3)])
    task = submit("What is 6 * 7?")
    engine.execute_run(task.runs.get().pk)

    html = page(client, f"/tasks/{task.pk}/")

    assert "Succeeded" in html
    assert "conductor llm-test" in html
    assert html.count('class="step-row"') == 2
    assert "<td>alpha</td>" in html and "<td>gamma</td>" in html
    assert "<td>acme</td>" in html and "<td>globex</td>" in html
    assert "Draft an answer" in html and "Check the draft" in html
    assert "draft: 42" in html and 'id="final-answer">final: 42<' in html
    assert "100 / 20" in html and "200 / 3" in html
    assert "0.000140" in html  # alpha: 100 * $1/M + 20 * $2/M
    assert "0.000645" in html  # gamma: 200 * $3/M + 3 * $15/M
    assert "<td>all earlier</td>" in html and "<td>nothing</td>" in html


def test_the_run_says_how_long_it_ran_and_apart_how_long_it_waited_in_the_queue(client, live_pool):
    """A run that waited 30 s for a worker and then ran in well under a second read "Succeeded in
    30.2 s": its creation to its end, the queue counted as running time."""
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Answer", [])))])
    server.program("alpha", [Reply("42")])
    task = submit("What is 6 * 7?")
    run = task.runs.get()
    Run.objects.filter(pk=run.pk).update(created_at=run.created_at - timedelta(seconds=30))
    engine.execute_run(run.pk)
    run.refresh_from_db()
    assert run.queued_s >= 30 and run.ran_s < 10 and run.latency_s == pytest.approx(run.queued_s + run.ran_s)

    html = page(client, f"/tasks/{task.pk}/")

    said = re.search(r"Succeeded</span>\s*in ([\d.]+) s, after ([\d.]+) s in the queue", html)
    assert said, html
    assert float(said[1]) == pytest.approx(run.ran_s, abs=0.01) and float(said[2]) >= 30


def test_the_score_says_which_scorer_graded_and_the_answer_it_read_out_of_the_final_answer(client, live_pool):
    """The page showed "Score 0.00 (auto scorer)" beside a final answer in a JSON fence: nothing said
    which scorer "auto" meant, nor what it compared with the reference."""
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Answer", [])))])
    server.program("alpha", [Reply('```json\n{"reasoning": "4 * 44 = 176", "answer": "<b>176</b>"}\n```')])
    task, _ = task_submit(
        submission=TaskSubmission(text="What is 4 * 44?", reference="175", domain="gsm8k"),
        source=Task.Source.API,
    )
    engine.execute_run(task.runs.get().pk)

    html = page(client, f"/tasks/{task.pk}/")

    score = re.search(r'<dd id="task-score">(.*?)</dd>', html, re.S)
    assert score, html
    assert score[1] == "0.00 (numeric scorer) · the answer it read: <code>&lt;b&gt;176&lt;/b&gt;</code>"


def test_a_nested_plan_names_the_step_it_came_from_by_its_number_on_the_page(client, live_pool):
    """The nested plan's heading said "from step 87" (the step's database id) above steps numbered 0 and 1."""
    program_recursion(live_pool["server"])
    task, _ = task_submit(submission=TaskSubmission(text="Check it", max_depth=1), source=Task.Source.API)
    engine.execute_run(task.runs.get().pk)
    parent = Step.objects.get(run__task=task, worker_slug="conductor")
    assert parent.index == 1 and parent.pk != 1

    html = page(client, f"/tasks/{task.pk}/")

    assert "Nested plan (depth 1, from step 1)" in html


def test_the_task_list_shows_who_answered_where_it_went_and_filters_by_them(client, live_pool):
    server = live_pool["server"]
    outer = plan_json(("alpha", "Draft", []), ("conductor", "Decide whether to check the draft", "all"))
    inner = plan_json(("gamma", "Check the draft", "all"))

    def conductor(body):
        text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        if "checked by a nested plan" not in text:
            return Reply(plan_json(("beta", "Answer", [])))
        return Reply(inner if "You were called as a step" in text else outer)

    server.program("conductor", conductor)
    server.program("alpha", [Reply("draft answer")])
    server.program("beta", [Reply("plain answer")])
    server.program("gamma", [Reply("checked answer")])
    nested, _ = task_submit(
        submission=TaskSubmission(text="A task checked by a nested plan", max_depth=1), source=Task.Source.API
    )
    plain, _ = task_submit(submission=TaskSubmission(text="A plain task"), source=Task.Source.CLI)
    for task in (nested, plain):
        engine.execute_run(task.runs.get().pk)

    def rows(url: str) -> list[str]:
        html = page(client, url)
        body = html.split('id="task-table"')[1].split("</table>")[0] if 'id="task-table"' in html else ""
        return body.split("<tr>")[2:]  # after the header row

    listed = rows("/")
    assert len(listed) == 2
    row = next(r for r in listed if "nested plan" in r)
    cells = [c.split("</td>")[0] for c in row.split("<td")[1:]]
    assert f"<code>{str(nested.pk)[:8]}</code>" in cells[0]
    assert cells[2] == ">REST API"  # its source
    # The worker that wrote the final answer is gamma, in the nested plan: not the conductor step.
    assert "<td>gamma</td>" in row and "<td>conductor</td>" not in row
    assert "<td>acme, globex</td>" in row  # alpha (acme) and gamma (globex)
    assert " s</td>" in row  # its latency
    assert "<td>beta</td>" in next(r for r in listed if "plain task" in r)

    assert [("nested plan" in r) for r in rows("/?worker=gamma")] == [True]
    assert '<option value="gamma" selected>gamma</option>' in page(client, "/?worker=gamma")  # kept chosen
    assert [("plain task" in r) for r in rows("/?worker=beta")] == [True]
    assert [("nested plan" in r) for r in rows("/?vendor=globex")] == [True]
    assert [("plain task" in r) for r in rows("/?source=cli")] == [True]
    assert len(rows("/?conductor=llm-test")) == 2
    assert rows("/?vendor=nobody") == []
    # The short id the pages show finds its task; the list says what it is filtered by.
    html = page(client, f"/?q={str(plain.pk)[:8]}&source=cli")
    assert "A plain task" in html and "nested plan" not in html
    assert 'id="filtered-by">Filtered by search <strong>' in html and "source <strong>cli</strong>" in html
    # Values that exist nowhere are refused with the reason, never ignored.
    for bad in ("worker=nobody", "conductor=nope", "source=fax"):
        response = client.get(f"/?{bad}")
        assert response.status_code == 400, bad
        assert bad.split("=")[0].encode() in response.content


def test_an_unknown_task_is_404(client):
    assert client.get(f"/tasks/{uuid.uuid4()}/").status_code == 404


def test_task_text_and_worker_responses_are_escaped(client, live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", f"Repeat {XSS}", [])))])
    server.program("alpha", [Reply(f"Here you are: {XSS}")])
    task = submit(f"Please echo {XSS}")
    engine.execute_run(task.runs.get().pk)

    for html in (page(client, f"/tasks/{task.pk}/"), page(client, "/")):
        assert XSS not in html
        scripts = re.findall(r"<script[^>]*>", html)  # only the app's own files, no inline script
        assert all(re.fullmatch(r'<script src="/static/[\w/.-]+">', tag) for tag in scripts), scripts
    detail = page(client, f"/tasks/{task.pk}/")
    assert f"Please echo {XSS_ESCAPED}" in detail  # task text
    assert f"Repeat {XSS_ESCAPED}" in detail  # instruction
    assert f"Here you are: {XSS_ESCAPED}" in detail  # worker response and final answer
    assert f"Please echo {XSS_ESCAPED}" in page(client, "/")


# --- workers ----------------------------------------------------------------------------------


def test_the_worker_page_lists_workers(client, live_pool):
    html = page(client, "/workers/")

    for slug in ("alpha", "beta", "gamma"):
        assert f"<td>{slug}</td>" in html and f"<code>openai/{slug}</code>" in html
    assert "globex" in html
    assert "15.0000" in html  # gamma's output price per million tokens
    assert "No workers are registered" not in html


def test_an_empty_worker_page_says_how_to_load_workers(client):
    assert "No workers are registered" in page(client, "/workers/")


# --- management command -----------------------------------------------------------------------


def run_command(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    extra = {"stdin": io.StringIO(stdin)} if stdin is not None else {}
    call_command("submit_task", *args, stdout=out, **extra)
    return out.getvalue().strip()


def test_submit_task_prints_the_id_and_creates_a_cli_task():
    output = run_command("What is 2 + 2?", "--reference", "4", "--classification", "public")

    task = Task.objects.get()
    assert output == f"{task.pk} submitted"
    assert task.source == Task.Source.CLI and task.submitted_by is None
    assert task.text == "What is 2 + 2?" and task.reference == "4" and task.classification == "public"
    assert AuditEvent.objects.get(action="task.submitted").actor_name == "cli-submit"


def test_submit_task_with_the_same_idempotency_key_twice_creates_one_task():
    first = run_command("What is 2 + 2?", "--idempotency-key", "cli-1")
    second = run_command("What is 2 + 2?", "--idempotency-key", "cli-1")

    task = Task.objects.get()
    assert first == f"{task.pk} submitted"
    assert second == f"{task.pk} already submitted"
    assert AuditEvent.objects.filter(action="task.submitted").count() == 1


def test_submit_task_reads_the_text_from_stdin_and_prints_json():
    output = json.loads(run_command("-", "--json", stdin="A long task\nover two lines\n"))

    task = Task.objects.get()
    assert output == {"id": str(task.pk), "created": True, "status": "queued"}
    assert task.text == "A long task\nover two lines\n"


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["   "], None, "the task text is empty"),
        (["-"], "bad\x00text", "NUL character"),
        (["ok", "--max-usd", "-1"], None, "must not be negative"),
    ],
    ids=["blank", "nul", "negative-usd"],
)
def test_submit_task_refuses_bad_input(args, stdin, message):
    with pytest.raises(CommandError, match=message):
        run_command(*args, stdin=stdin)
    assert not Task.objects.exists()


def test_submit_task_refuses_a_reused_key_with_a_different_text():
    run_command("One", "--idempotency-key", "cli-2")

    with pytest.raises(CommandError, match="already used for a different task"):
        run_command("Two", "--idempotency-key", "cli-2")
    assert list(Task.objects.values_list("text", flat=True)) == ["One"]


def test_the_eight_character_id_the_pages_show_opens_the_task(client):
    task = submit("What is 6 * 7?")
    short = str(task.pk)[:8]

    response = client.get(f"/tasks/{short}/")

    assert response.status_code == 302
    assert response["Location"] == f"/tasks/{task.pk}/"
    assert short in page(client, "/")  # the id as the list shows it


def test_an_eight_character_id_that_names_several_tasks_lists_them_and_one_that_names_none_is_a_404(client):
    first = submit("What is 6 * 7?")
    short = str(first.pk)[:8]
    # A second id with the same first 8 characters (one in 4 billion by chance): made as a row.
    Task.objects.create(
        id=uuid.UUID(short + "0" * 24),
        text="What is 7 * 8?",
        max_steps=4,
        max_depth=1,
        max_usd=1,
        source="api",
    )

    several = client.get(f"/tasks/{short}/")
    unknown = "0" * 8 if not str(first.pk).startswith("0" * 8) else "f" * 8

    assert several.status_code == 302 and several["Location"] == f"/?q={short}"
    assert short in page(client, several["Location"])
    assert client.get(f"/tasks/{unknown}/").status_code == 404


def test_the_task_list_shows_the_time_queued_apart_from_the_run(client):
    task = submit("What is 6 * 7?")
    run = task.runs.get()
    submitted = task.created_at
    # Queued for 16.17 s, then ran for 0.03 s.
    Run.objects.filter(pk=run.pk).update(
        started_at=submitted + timedelta(seconds=16.17), finished_at=submitted + timedelta(seconds=16.2)
    )
    Task.objects.filter(pk=task.pk).update(finished_at=submitted + timedelta(seconds=16.2))

    html = page(client, "/")
    row = html[html.index(str(task.pk)[:8]) :]

    assert "From submission to the answer: time queued included" in html
    assert re.search(r">16\.2 s</td>\s*<td[^>]*>0\.03 s</td>", row)
