"""The playground in a real Chromium: an operator re-runs a step of a task with another worker and an
edited instruction, sees the cost before it runs, runs it, and finds the new run on the task's page."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from routing.models import Run, Step
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_reruns_a_step_with_another_worker_after_seeing_its_cost(
    page: Page, live_pool, log_in, screenshot
):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Compute 6 * 7", [])))])
    server.program("alpha", [Reply("41")])
    run = run_now(submit("What is 6 * 7?"))
    step = Step.objects.get(run=run)
    log_in("olga", Role.OPERATOR)

    page.goto(f"/tasks/{run.task_id}/")
    page.locator(f'details[data-key="step-{step.pk}"] summary').click()
    page.get_by_role("link", name="Re-run this step in the playground").click()
    expect(page.get_by_label("Instruction")).to_have_value("Compute 6 * 7")
    page.get_by_label("Worker", exact=True).select_option("beta")
    page.get_by_label("Instruction").fill("Compute 6 * 7, then check it")
    page.get_by_role("button", name="Show the cost").click()
    expect(page.locator("#playground-estimate")).to_contain_text("beta answers an edited instruction")
    expect(page.locator("#playground-estimate")).to_contain_text("About $")
    screenshot("playground-estimate")
    server.program("beta", [Reply("42")])
    page.get_by_role("button", name="Run it").click()

    played = Run.objects.get(kind=Run.Kind.PLAYGROUND)
    page.wait_for_url(f"**/tasks/{run.task_id}/#run-{played.pk}")
    expect(page.locator(".flash").first).to_contain_text(f"Playground run {played.pk} is queued")
    expect(page.locator(f"#run-{played.pk}")).to_contain_text("Playground")
    screenshot("playground-queued")
