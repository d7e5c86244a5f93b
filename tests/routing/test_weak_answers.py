"""An answer written by a worker marked weak (the demo's local 135M model) is labelled so wherever it is
shown: on the task page, in the task list and in the task API. The label follows the worker's field."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import Role
from routing import engine
from routing.local_pool import worker_fields
from routing.models import Task, Worker
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = 'class="weak-label"'


def answered(text: str, answer: str) -> Task:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)
    engine.execute_run(task.runs.get().pk)
    task.refresh_from_db()
    assert task.final_answer == answer
    return task


@pytest.fixture
def tasks(live_pool):
    """Two tasks: one answered by alpha, one by beta, each the only step of its plan."""
    server = live_pool["server"]
    server.program(
        "conductor", lambda body: Reply(plan_json(("alpha" if "weak" in str(body) else "beta", "Answer", [])))
    )
    server.program("alpha", [Reply("Santé, le maire de France.")])
    server.program("beta", [Reply("Paris")])
    return answered("A weak question", "Santé, le maire de France."), answered("A plain question", "Paris")


@pytest.fixture
def client(make_user) -> Client:
    client = Client()
    client.force_login(make_user("olga", Role.OPERATOR))
    return client


def list_rows(client: Client) -> dict[str, str]:
    html = client.get("/").content.decode()
    body = html.split('id="task-table"')[1].split("</table>")[0]
    return {row.split("<code>")[1][:8]: row for row in body.split("<tr>")[2:]}


def test_an_answer_of_a_weak_worker_is_labelled_on_the_task_page_the_list_and_the_api(client, tasks):
    weak, plain = tasks
    Worker.objects.filter(slug="alpha").update(weak=True)

    page = client.get(f"/tasks/{weak.pk}/").content.decode()
    answer = page.split("<h2>Final answer")[1].split("</pre>")[0]
    assert LABEL in answer and "alpha" in answer and "Santé, le maire de France." in answer
    assert LABEL not in client.get(f"/tasks/{plain.pk}/").content.decode()

    rows = list_rows(client)
    assert LABEL in rows[str(weak.pk)[:8]] and LABEL not in rows[str(plain.pk)[:8]]

    detail = client.get(f"/api/tasks/{weak.pk}/").json()
    assert (detail["final_worker"], detail["final_answer_weak"]) == ("alpha", True)
    assert client.get(f"/api/tasks/{plain.pk}/").json()["final_answer_weak"] is False
    listed = {t["id"]: t for t in client.get("/api/tasks/").json()["results"]}
    assert (listed[str(weak.pk)]["final_worker"], listed[str(weak.pk)]["final_answer_weak"]) == (
        "alpha",
        True,
    )
    assert (listed[str(plain.pk)]["final_worker"], listed[str(plain.pk)]["final_answer_weak"]) == (
        "beta",
        False,
    )
    assert client.get("/api/workers/alpha/").json()["weak"] is True


def test_no_answer_is_labelled_while_no_worker_is_marked_weak(client, tasks):
    weak, _ = tasks

    assert LABEL not in client.get(f"/tasks/{weak.pk}/").content.decode()
    assert all(LABEL not in row for row in list_rows(client).values())
    assert client.get(f"/api/tasks/{weak.pk}/").json()["final_answer_weak"] is False


def test_the_local_model_is_registered_as_weak():
    assert worker_fields("http://127.0.0.1:8089/v1")["weak"] is True


def test_the_worker_list_labels_a_weak_worker(client, live_pool):
    Worker.objects.filter(slug="alpha").update(weak=True)

    rows = client.get("/workers/").content.decode().split("<tr>")
    assert [LABEL in row for row in rows if "<td>alpha" in row or "<td>beta" in row] == [True, False]
