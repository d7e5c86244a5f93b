"""Runs side by side (operations.compare.side_by_side): a live run beside its shadow run and runs of one recorded item,
made by the real engine against the loopback OpenAI server; the page, its API and who may open them."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.test import Client

from accounts.models import Role
from audit.grants import token_create
from audit.models import AuditEvent
from audit.services import Actor
from operations.compare import side_by_side
from operations.compare.side_by_side import RunChoiceError, compare_runs, run_ids, runs_for_compare
from routing import engine
from routing.models import ConductorVersion, Run, RunStatus, Task
from routing.services import TaskSubmission, conductor_activate, task_submit
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import program_recursion
from utilities.params import InvalidParameter

pytestmark = pytest.mark.django_db(transaction=True)

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def llm_conductor(server, name: str, model: str, **flags) -> ConductorVersion:
    """An LLM conductor served by the loopback server as `model`."""
    return ConductorVersion.objects.create(
        name=name,
        backend=ConductorVersion.Backend.LLM,
        config={"model": f"hosted_vllm/{model}", "api_base": server.base_url},
        **flags,
    )


def execute(run: Run) -> Run:
    engine.execute_run(run.pk)
    run.refresh_from_db()
    return run


@pytest.fixture
def shadowed(live_pool) -> tuple[Run, Run]:
    return live_and_shadow(live_pool["server"])


def live_and_shadow(server) -> tuple[Run, Run]:
    """A live run (alpha drafts, gamma checks) and the shadow run beside it (alpha alone, the same
    first step), executed by the engine."""
    llm_conductor(server, "llm-shadow", "shadow", is_shadow=True)
    server.program(
        "conductor",
        [
            Reply(
                plan_json(
                    ("alpha", "Draft an answer", []), ("gamma", "Check the draft", "all"), thought="check"
                )
            )
        ],
    )
    server.program("shadow", [Reply(plan_json(("alpha", "Draft an answer", []), thought="one is enough"))])
    server.program("alpha", [Reply(f"draft: 42 {XSS}", prompt_tokens=100, completion_tokens=20)])
    server.program("gamma", [Reply("final: 42", prompt_tokens=200, completion_tokens=3)])
    task, _ = task_submit(submission=TaskSubmission(text=f"What is 6 * 7? {XSS}"), source=Task.Source.API)
    live = execute(task.runs.get(kind=Run.Kind.LIVE))
    shadow = execute(task.runs.get(kind=Run.Kind.SHADOW))
    assert (live.status, shadow.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED), (
        live.error,
        shadow.error,
    )
    return live, shadow


def rows(comparison, section: str) -> dict[str, side_by_side.Row]:
    found = next(s for s in comparison.sections if s.key == section)
    return {row.field: row for row in found.rows}


# --- The read model ---------------------------------------------------------------------------------


def test_a_live_run_and_its_shadow_are_aligned_step_by_step_with_their_differences_marked(shadowed):
    live, shadow = shadowed

    comparison = compare_runs(runs_for_compare([live.pk, shadow.pk]))

    assert [r.id for r in comparison.runs] == [live.pk, shadow.pk]
    assert [s.key for s in comparison.sections] == ["run", "plan", "step-0", "step-1"]
    run = rows(comparison, "run")
    assert run["conductor"].values == ("llm-test", "llm-shadow") and run["conductor"].differs
    assert run["kind"].values == ("Live", "Shadow") and run["kind"].differs
    assert not run["backend"].differs and not run["task"].differs and not run["status"].differs
    assert run["final_answer"].values == ("final: 42", f"draft: 42 {XSS}") and run["final_answer"].differs
    # Money stays Decimal: alpha 100 * $1/M + 20 * $2/M; gamma 200 * $3/M + 3 * $15/M; plans apart.
    assert run["cost_usd"].values == (live.cost_usd, shadow.cost_usd)
    assert all(isinstance(v, Decimal) for v in run["cost_usd"].values) and run["cost_usd"].differs
    assert run["input_tokens"].differs and run["queued_s"].kind == side_by_side.SECONDS
    plan = rows(comparison, "plan")
    assert plan["thought"].values == ("check", "one is enough") and plan["steps"].values == (2, 1)
    first = rows(comparison, "step-0")
    assert first["worker"].values == ("alpha", "alpha") and not first["worker"].differs
    assert not first["instruction"].differs and not first["answer"].differs
    assert (
        first["cost_usd"].values == (Decimal("0.00014"), Decimal("0.00014")) and not first["cost_usd"].differs
    )
    second = rows(comparison, "step-1")
    assert second["worker"].values == ("gamma", None) and second["worker"].differs
    assert second["answer"].values == ("final: 42", None) and second["sees"].values == ("all earlier", None)
    assert comparison.differing == sum(r.differs for s in comparison.sections for r in s.rows) > 0


def test_a_nested_plan_is_aligned_under_the_step_that_wrote_it(live_pool):
    program_recursion(live_pool["server"])
    nested = execute(
        task_submit(submission=TaskSubmission(text="Q", max_depth=1), source=Task.Source.API)[0].runs.get()
    )
    live_pool["server"].program(
        "conductor", [Reply(plan_json(("alpha", "Draft", []), ("gamma", "Check", "all")))]
    )
    flat = execute(task_submit(submission=TaskSubmission(text="Q"), source=Task.Source.API)[0].runs.get())

    comparison = compare_runs(runs_for_compare([nested.pk, flat.pk]))

    assert [s.key for s in comparison.sections] == ["run", "plan", "step-0", "step-1", "step-1.0"]
    assert rows(comparison, "step-1")["worker"].values == ("conductor", "gamma")
    assert rows(comparison, "step-1.0")["worker"].values == ("gamma", None)
    assert rows(comparison, "plan")["steps"].values == (3, 2)


@pytest.fixture
def one_item_two_conductors(live_pool) -> tuple[Run, Run]:
    """One recorded item submitted twice (two tasks), planned by llm-test, then by llm-other: right
    (score 1), then wrong (score 0)."""
    server = live_pool["server"]
    other = llm_conductor(server, "llm-other", "other")
    server.program("conductor", [Reply(plan_json(("alpha", "Solve", [])))])
    server.program("other", [Reply(plan_json(("beta", "Solve", [])))])
    server.program("alpha", [Reply("42")])
    server.program("beta", [Reply("41")])
    item = TaskSubmission(text="What is 6 * 7?", reference="42", domain="gsm8k", source_item="gsm8k-7")
    first = execute(task_submit(submission=item, source=Task.Source.API)[0].runs.get())
    conductor_activate(version=other, actor=Actor.service("tests"))
    second = execute(task_submit(submission=item, source=Task.Source.API)[0].runs.get())
    return first, second


def test_runs_of_two_tasks_of_one_recorded_item_under_two_conductors(one_item_two_conductors):
    first, second = one_item_two_conductors

    comparison = compare_runs(runs_for_compare([first.pk, second.pk]))

    run = rows(comparison, "run")
    assert run["task"].differs and not run["item"].differs and run["item"].values == ("gsm8k-7", "gsm8k-7")
    assert run["score"].values == (1.0, 0.0) and run["score"].differs
    assert rows(comparison, "step-0")["worker"].values == ("alpha", "beta")


def query(*values: str):
    from django.http import QueryDict

    return QueryDict("&".join(f"run={v}" for v in values))


def test_the_runs_asked_for_are_read_strictly(shadowed):
    live, shadow = shadowed
    assert run_ids(query()) == [] and run_ids(query("12", "", "15")) == [12, 15]
    for values, reason in (
        (("1", "2", "3", "4", "5"), "at most 4 runs"),
        (("12", "12"), "run 12 is given twice"),
        (("abc",), "not a whole number"),
        (("0",), "between 1 and"),
        (("9" * 40,), "not a whole number"),
    ):
        with pytest.raises(InvalidParameter, match=reason):
            run_ids(query(*values))
    with pytest.raises(RunChoiceError, match="give 2 to 4 run ids"):
        runs_for_compare([live.pk])
    with pytest.raises(RunChoiceError, match=f"no run has the id {shadow.pk + 100}"):
        runs_for_compare([live.pk, shadow.pk + 100])


# --- The page ---------------------------------------------------------------------------------------


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_task_page_links_to_its_runs_side_by_side_with_the_differences_marked(shadowed, make_user):
    live, shadow = shadowed
    client = logged_in(make_user("ann", Role.AUDITOR))

    task_page = client.get(f"/tasks/{live.task_id}/").content.decode()
    link = re.search(r'<a href="([^"]+)" id="compare-runs"', task_page)
    assert link and link[1] == f"/runs/compare/?run={live.pk}&amp;run={shadow.pk}"
    response = client.get(link[1].replace("&amp;", "&"))

    assert response.status_code == 200
    html = response.content.decode()
    assert f">Run {live.pk}</a>" in html and f">Run {shadow.pk}</a>" in html
    conductor = re.search(r'<tr data-field="conductor" class="differs">(.*?)</tr>', html, re.S)
    assert conductor and "≠ differs" in conductor[1] and conductor[1].count('class="differs"') == 2
    assert '<tr data-field="backend">' in html  # the same backend: not marked
    assert XSS not in html and XSS_ESCAPED in html  # task text and answers are escaped
    assert "$0.000140" in html  # money as the task page shows it
    views = AuditEvent.objects.filter(action="record.viewed", payload__view="run comparison")
    assert [(e.task_id, e.actor_name) for e in views] == [(live.task_id, "ann")]


def test_the_page_refuses_what_it_cannot_compare_with_a_reason(shadowed, make_user):
    live, shadow = shadowed
    client = logged_in(make_user("olga", Role.OPERATOR))

    assert 'id="compare-form"' in client.get("/runs/compare/").content.decode()
    for asked, reason in (
        (f"run={live.pk}", "give 2 to 4 run ids"),
        ("&".join(f"run={n}" for n in range(1, 6)), "at most 4 runs"),
        (f"run={live.pk}&run={shadow.pk + 100}", f"no run has the id {shadow.pk + 100}"),
        (f"run={live.pk}&run=abc", "not a whole number"),
    ):
        response = client.get(f"/runs/compare/?{asked}")
        assert response.status_code == 400 and reason in response.content.decode(), asked
    assert not AuditEvent.objects.filter(action="record.viewed").exists()


def test_who_may_open_the_page(shadowed, make_user):
    live, shadow = shadowed
    url = f"/runs/compare/?run={live.pk}&run={shadow.pk}"

    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    assert logged_in(make_user("nobody")).get(url).status_code == 403
    for role in (Role.AUDITOR, Role.OPERATOR, Role.ML_STAFF, Role.ADMIN):
        assert logged_in(make_user(f"user-{role}", role)).get(url).status_code == 200, role


# --- The API ----------------------------------------------------------------------------------------


def test_the_api_gives_the_same_comparison_to_every_role_that_reads_tasks(shadowed, make_user):
    live, shadow = shadowed
    url = f"/api/runs/compare/?run={live.pk}&run={shadow.pk}"
    assert Client().get(url).status_code == 403
    assert logged_in(make_user("nobody")).get(url).status_code == 403
    key = token_create(user=make_user("mia", Role.ML_STAFF), role=Role.ML_STAFF, name="compare").key

    response = Client(HTTP_AUTHORIZATION=f"Token {key}").get(url)

    assert response.status_code == 200
    body = response.json()
    assert [r["id"] for r in body["runs"]] == [live.pk, shadow.pk]
    sections = {s["key"]: {r["field"]: r for r in s["rows"]} for s in body["sections"]}
    assert sections["run"]["conductor"] == {
        "field": "conductor",
        "label": "Conductor version",
        "kind": "text",
        "differs": True,
        "values": ["llm-test", "llm-shadow"],
    }
    assert sections["run"]["cost_usd"]["values"] == [str(live.cost_usd), str(shadow.cost_usd)]  # exact
    assert sections["step-1"]["worker"]["values"] == ["gamma", None]
    assert body["differing"] == compare_runs(runs_for_compare([live.pk, shadow.pk])).differing
    assert AuditEvent.objects.filter(payload__view="run comparison (api)", actor_name="mia").count() == 1

    refused = logged_in(make_user("ann", Role.AUDITOR)).get(f"/api/runs/compare/?run={live.pk}")
    assert refused.status_code == 400 and "give 2 to 4 run ids" in refused.json()["detail"]


def test_the_api_schema_declares_the_comparison(make_user):
    schema = logged_in(make_user("ann", Role.AUDITOR)).get("/api/schema/?format=json").json()

    operation = schema["paths"]["/api/runs/compare/"]["get"]
    assert [p["name"] for p in operation["parameters"]] == ["run"]
    assert "RunComparisonOutput" in schema["components"]["schemas"]


def test_an_evaluation_links_each_item_it_lists_to_its_two_runs_side_by_side(
    one_item_two_conductors, make_user
):
    from training.models import Evaluation, EvaluationRun, JobStatus

    baseline, candidate = one_item_two_conductors
    evaluation = Evaluation.objects.create(
        candidate=candidate.conductor_version, baseline=baseline.conductor_version, status=JobStatus.SUCCEEDED
    )
    for side, run in (("baseline", baseline), ("candidate", candidate)):
        EvaluationRun.objects.create(evaluation=evaluation, run=run, side=side, item="gsm8k-7")

    html = (
        logged_in(make_user("mia", Role.ML_STAFF))
        .get(f"/training/evaluations/{evaluation.pk}/")
        .content.decode()
    )

    assert f'href="/runs/compare/?run={baseline.pk}&amp;run={candidate.pk}" class="compare-pair"' in html
