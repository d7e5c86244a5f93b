"""The ML staff's training pages in a real browser: launch a job from the form, watch it train live."""

from __future__ import annotations

import contextlib
import time

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from tests.browser.conftest import wait_until
from training.models import JobStatus, TrainingJob, TrainingMetric

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

POINTS_JS = """() => Array.from(document.querySelectorAll('#job-curves .chart'))
  .flatMap((div) => div.data || []).reduce((n, trace) => n + trace.x.length, 0)"""

# One small chart per metric: its caption, its y axis's title, how many series it holds.
CURVES_JS = """() => Array.from(document.querySelectorAll('#job-curves figure.curve')).map((f) => {
  const div = f.querySelector('.chart');
  return { metric: f.dataset.metric, caption: f.querySelector('figcaption').textContent,
           y: div.layout.yaxis.title.text, x: div.layout.xaxis.title.text, series: div.data.length };
})"""


def purge_training_queue() -> None:
    from django.conf import settings

    from conductor_web.celery import app

    with app.connection_for_write() as conn, contextlib.suppress(Exception):  # it may not exist yet
        conn.default_channel.queue_purge(settings.CONDUCTOR_QUEUE_PREFIX + "training")


@pytest.fixture
def training_worker(celery_workers, settings, tmp_path):
    """`start()`: a real celery worker consuming the runs and the training queues, writing its
    artifacts under a private VAR_DIR (the live server reads the same one)."""
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    purge_training_queue()
    yield lambda: celery_workers(
        "trainer", queues=("runs", "training"), CONDUCTOR_VAR_DIR=str(settings.VAR_DIR)
    )
    purge_training_queue()


def test_ml_staff_launch_a_learned_job_and_watch_it_train(page: Page, log_in, training_worker, screenshot):
    log_in("mira", Role.ML_STAFF)
    page.get_by_role("link", name="Training").click()
    expect(page.get_by_role("heading", name="Launch a training job")).to_be_visible()
    expect(page.locator("#job-form fieldset[data-backend='llm-lora']")).to_be_hidden()
    expect(page.locator("#versions")).to_contain_text("static-v1")
    screenshot("training-home")

    page.locator("#id_job-name").fill("learned-browser")
    page.locator("#id_job-backend").select_option("learned")
    page.locator("#id_job-split").select_option("train")
    page.locator("#id_job-limit").fill("60")
    # Small, yet long enough (several seconds, on a fast machine too) for the page's 1 s polls to
    # see it part-way: 50 epochs (under a second of training here) could finish between two polls.
    page.locator("#id_job-epochs").fill("400")
    page.get_by_role("button", name="Launch job").click()

    # The job page, before any worker took the job: queued, nothing plotted yet.
    page.wait_for_url("**/training/jobs/*/")
    job = TrainingJob.objects.get(name="learned-browser")
    assert job.options["limit"] == 60 and job.options["epochs"] == 400
    expect(page.locator("#job-banner")).to_contain_text("Training job learned-browser is queued")
    wait_until(page, "document.body.dataset.curvesReady === '1'")
    assert page.evaluate(POINTS_JS) == 0
    assert float(page.locator("#job-progress").get_attribute("value")) == 0.0

    worker = training_worker()  # a real worker process now consumes the training queue

    # Sample the page (no reloads) while the job runs: the curve grows and the bar moves.
    samples: list[tuple[float, int]] = []
    phases: set[str] = set()  # what the page said runs after the last epoch
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if page.locator("#job-phase").is_visible():
            phases.add(page.locator("#job-banner").inner_text())
        progress = float(page.locator("#job-progress").get_attribute("aria-valuenow"))
        points = page.evaluate(POINTS_JS)
        if not samples or samples[-1] != (progress, points):
            samples.append((progress, points))
        if page.evaluate("document.body.dataset.jobFinished === '1'"):
            break
        time.sleep(0.1)
    else:
        job.refresh_from_db()
        raise AssertionError(
            f"the job did not finish on the page (job {job.status}, step {job.step}); samples: {samples}\n"
            + "".join(worker.lines[-40:])
        )

    # The finished state, read after the page said it finished (a sample may predate the last poll).
    final = (float(page.locator("#job-progress").get_attribute("aria-valuenow")), page.evaluate(POINTS_JS))
    if samples[-1] != final:
        samples.append(final)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    expect(page.locator("#job-status")).to_have_text("Succeeded")
    # The banner followed the status, and the cross-validation after the last epoch was said as it ran.
    expect(page.locator("#job-banner")).to_have_text(
        "Training job learned-browser succeeded. Candidate: learned-browser."
    )
    expect(page.locator("#job-phase")).to_be_hidden()
    assert any("past its last step: cross-validating the cost penalties" in text for text in phases), phases
    progress, points = samples[-1]
    assert progress == 100.0
    assert float(page.locator("#job-progress").get_attribute("value")) == 100.0
    # Every numeric value the job logged is a point on the page, drawn without a reload.
    logged = sum(
        1
        for values in TrainingMetric.objects.filter(job=job).values_list("values", flat=True)
        for v in values.values()
        if isinstance(v, int | float) and not isinstance(v, bool)
    )
    assert logged > 0 and points == logged, samples
    # The curve grew in steps while the job ran (not all at once at the end), and so did the bar.
    counts = [n for _, n in samples]
    assert counts == sorted(counts) and counts[0] == 0, samples
    took = (job.finished_at - job.started_at).total_seconds()
    assert any(0 < n < points for n in counts), f"{samples} (the job took {took:.1f} s)"
    assert any(0 < p < 100 for p, _ in samples), samples
    # Small multiples: one chart per metric, each axis titled with its unit; the known metrics first.
    assert page.evaluate(CURVES_JS) == [
        {"metric": "reward", "caption": "Mean reward", "y": "reward", "x": "step", "series": 1},
        {"metric": "accuracy", "caption": "Accuracy", "y": "share correct", "x": "step", "series": 1},
        {"metric": "usd_per_1000", "caption": "Cost", "y": "USD per 1,000 tasks", "x": "step", "series": 1},
    ]
    if job.candidate_id:
        expect(page.locator("#job-candidate")).to_contain_text(job.candidate.name)
    expect(page.locator("#job-log")).not_to_be_empty()
    expect(page.locator("#job-cancel")).to_have_count(0)
    expect(page.locator("#job-finished-at")).not_to_have_text("—")
    # The learned policy's weights: a download link, filled in live, that serves the file.
    weights = page.locator("#job-artifacts a", has_text="policy.json")
    expect(weights).to_be_visible()
    download = page.request.get(weights.get_attribute("href"))
    assert download.ok and b'"weights"' in download.body()
    screenshot("training-job")


def test_the_evaluation_page_plots_candidate_and_baseline(page: Page, log_in, screenshot):
    from routing.models import ConductorVersion
    from routing.services import conductor_active
    from training.models import Evaluation

    baseline = conductor_active()
    candidate = ConductorVersion.objects.create(name="learned-eval", backend="learned")
    row = {"p95_plan_ms": 3.2, "n": 40, "failed": 0}
    evaluation = Evaluation.objects.create(
        candidate=candidate,
        baseline=baseline,
        status=JobStatus.SUCCEEDED,
        results={
            "candidate": {"version": "learned-eval", "accuracy": 0.8, "usd_per_1000": "2.5", **row},
            "baseline": {"version": "static-v1", "accuracy": 0.7, "usd_per_1000": "4.0", **row},
        },
    )
    log_in("mira", Role.ML_STAFF)
    page.goto(f"/training/evaluations/{evaluation.pk}/")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    assert page.locator("#evaluation-chart .scatterlayer .point").count() == 2
    expect(page.locator("#evaluation-table tr[data-side='candidate']")).to_contain_text("0.800")
    expect(page.locator("#evaluation-table tr[data-side='baseline']")).to_contain_text("static-v1")
    screenshot("training-evaluation")


def test_a_running_evaluation_page_follows_it_to_the_end_without_a_reload(page: Page, log_in, screenshot):
    """The page re-reads itself (static/js/live.js) and swaps in the summary and the chart: no
    reload, the reader's place kept, and it stops following once the evaluation has finished."""
    from routing.models import ConductorVersion
    from routing.services import conductor_active
    from training.models import Evaluation

    evaluation = Evaluation.objects.create(
        candidate=ConductorVersion.objects.create(name="learned-live", backend="learned"),
        baseline=conductor_active(),
        status=JobStatus.RUNNING,
    )
    log_in("mira", Role.ML_STAFF)
    page.goto(f"/training/evaluations/{evaluation.pk}/")
    expect(page.locator("#evaluation-chart")).to_have_text("No results yet.")
    expect(page.locator("#evaluation-live")).to_have_text("live", timeout=10_000)
    page.evaluate("window.__noReload = 1")
    navigations: list[str] = []
    page.on(
        "framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None
    )

    row = {"p95_plan_ms": 3.2, "n": 40, "failed": 0}
    Evaluation.objects.filter(pk=evaluation.pk).update(
        status=JobStatus.SUCCEEDED,
        results={
            "candidate": {"version": "learned-live", "accuracy": 0.8, "usd_per_1000": "2.5", **row},
            "baseline": {"version": "static-v1", "accuracy": 0.7, "usd_per_1000": "4.0", **row},
        },
    )
    expect(page.locator("#evaluation-status")).to_have_text("Succeeded", timeout=15_000)
    expect(page.locator("#evaluation-live")).to_have_text("finished")
    expect(page.locator("#evaluation-table tr[data-side='candidate']")).to_contain_text("0.800")
    wait_until(page, "document.querySelectorAll('#evaluation-chart .scatterlayer .point').length === 2")
    assert page.evaluate("window.__noReload") == 1 and navigations == [], "the page was reloaded"
    assert page.evaluate("window.__conductorEvaluation.finished") is True
    reads = page.evaluate("window.__conductorEvaluation.reads")
    page.wait_for_timeout(4_000)  # longer than its period: a finished page reads no more
    assert page.evaluate("window.__conductorEvaluation.reads") == reads
    screenshot("training-evaluation-followed")
