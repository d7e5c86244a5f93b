"""A learned job's page plots the cross-validated frontier it was chosen from against the fixed workflows."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from tests.browser.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TRACES_JS = """() => document.getElementById('frontier-chart').data.map(
  (t) => ({name: t.name, points: t.x.length}))"""


def test_a_learned_job_page_plots_its_frontier_against_the_fixed_workflows(
    page: Page, log_in, replay_pool, settings, tmp_path, screenshot
):
    from audit.services import Actor
    from training.frontier import COST_PENALTIES
    from training.models import TrainingJob
    from training.services import job_start
    from training.tasks import train_job

    settings.VAR_DIR = tmp_path  # the live server runs in this process: it reads the same setting
    job = job_start(
        name="learned-frontier",
        backend=TrainingJob.Backend.LEARNED,
        dataset=None,
        options={"limit": 60, "epochs": 3},
        actor=Actor.service("test"),
        queue=False,
    )
    train_job(job.pk)
    job.refresh_from_db()
    frontier = job.candidate.config["frontier"]

    log_in("mira", Role.ML_STAFF)
    page.goto(f"/training/jobs/{job.pk}/")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    traces = page.evaluate(TRACES_JS)
    on_frontier = sum(p["on_frontier"] for p in frontier["points"])
    assert traces == [
        {"name": "fixed workflows", "points": len(frontier["fixed"])},
        {"name": "learned (off the frontier)", "points": len(frontier["points"]) - on_frontier},
        {"name": "learned frontier", "points": on_frontier},
    ]
    assert len(frontier["fixed"]) == 34 and on_frontier >= 1  # every workflow of default_actions
    assert {*COST_PENALTIES, 20.0} <= {p["cost_penalty_per_usd"] for p in frontier["points"]}
    expect(page.locator("#frontier-points tbody tr")).to_have_count(len(frontier["points"]))
    expect(page.locator("#frontier-points tr.chosen")).to_contain_text("20.0")
    screenshot("training-frontier")
