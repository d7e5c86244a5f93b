"""In Chromium, on runs the real engine made: the evaluation that decides a promotion (deltas, a
Promote that needs its confirmation), and the auditors' exposure maps (the vendors page's Sankey and
a dossier's map, whose cells open the exact messages on the task page)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion, Step, Task
from routing.services import TaskSubmission, task_submit
from tests.browser.conftest import wait_until
from tests.openai_server import Reply, plan_json
from training.models import EvaluationRun
from training.policy import Policy, Workflow
from training.services import conductor_promote, evaluation_refresh, evaluation_start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]
ACTOR = Actor.service("test")


def policy(tmp_path, name: str, worker: str) -> ConductorVersion:
    path = tmp_path / f"{name}.json"
    path.write_text(Policy.new([Workflow("single", (worker,))]).to_json())
    return ConductorVersion.objects.create(name=name, backend="learned", config={"policy_path": str(path)})


def test_ml_staff_read_the_deltas_and_promote_only_after_confirming_them(
    page: Page, log_in, replay_pool, tmp_path, screenshot
):
    baseline = policy(tmp_path, "gemma-only", "gemma-2-9b-it")
    conductor_promote(version=baseline, actor=ACTOR)
    candidate = policy(tmp_path, "gpt4o-only", "gpt-4o-2024-08-06")
    evaluation = evaluation_start(candidate=candidate, split="dev", limit=24, actor=ACTOR)
    for link in EvaluationRun.objects.filter(evaluation=evaluation):
        engine.execute_run(link.run_id)
    evaluation_refresh(evaluation)

    log_in("mira", Role.ML_STAFF)
    page.goto(f"/training/evaluations/{evaluation.pk}/")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    expect(page.locator("#evaluation-deltas tr[data-metric='usd_per_1000'] td[data-verdict]")).to_have_text(
        "dearer"
    )
    expect(page.locator("#evaluation-domains tbody tr").first).to_be_visible()
    expect(page.locator("#promote-form")).to_contain_text("Promote gpt4o-only over gemma-only?")
    screenshot("evaluation-decision")

    page.locator("#promote-form button[type=submit]").click()  # not confirmed: the browser refuses
    assert page.evaluate("document.querySelector('#promote-form input[name=confirm]').validity.valueMissing")
    assert not ConductorVersion.objects.get(pk=candidate.pk).is_active

    page.locator("#promote-form input[name=confirm]").check()
    page.locator("#promote-form button[type=submit]").click()
    expect(page.locator(".flash, .messages").first).to_contain_text("gpt4o-only is now the active conductor")
    assert page.url.endswith(f"/training/evaluations/{evaluation.pk}/")
    assert ConductorVersion.objects.get(pk=candidate.pk).is_active
    expect(page.locator("#promote-form")).to_have_count(0)


@pytest.fixture
def engine_task(live_pool):
    server = live_pool["server"]
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Find it", []), ("beta", "Check it", []), ("gamma", "Sum up", [0])))],
    )
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, [Reply(f"{slug} answers", prompt_tokens=50, completion_tokens=5)])
    task, _ = task_submit(submission=TaskSubmission(text="Where did this go?"), source=Task.Source.API)
    engine.execute_run(task.runs.get().pk)
    return task


def test_auditors_follow_data_from_the_vendors_map_to_the_messages_a_step_sent(
    page: Page, log_in, engine_task, screenshot
):
    log_in("ada", Role.AUDITOR)
    page.goto("/audit/vendors/")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    assert page.locator("#exposure-sankey .sankey-link").count() == 2  # internal -> acme, internal -> globex
    screenshot("exposure-map")

    page.locator("#exposure-links a", has_text="globex").click()
    expect(page.locator("#filtered-by")).to_contain_text("globex")
    page.locator(f"a[href='/audit/tasks/{engine_task.pk}/']").click()

    expect(page.locator("#exposure-map table.exposure")).to_be_visible()
    screenshot("dossier-exposure")
    gamma = Step.objects.get(run__task=engine_task, worker_slug="gamma")
    page.locator("#exposure-map tr[data-kind='answer'] td.sent a").click()  # alpha's answer, sent by gamma
    assert page.url.endswith(f"/tasks/{engine_task.pk}/#step-{gamma.pk}")
    details = page.locator(f"details[data-key='step-{gamma.pk}']")
    expect(details).to_have_attribute("open", "")
    expect(details).to_contain_text("alpha answers")  # the answer it was shown, in the messages sent
