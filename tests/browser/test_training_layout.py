"""The training pages at 1,400 px: long unbroken prompts, plans, JSON, paths and names wrap or scroll inside
their own boxes; no page is wider than the window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from tests.browser.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WIDTH = 1400
LONG = "x" * 3000  # no space, no hyphen: nothing a browser breaks on by itself
LONG_PLAN = json.dumps(
    {
        "thought": "a" * 400,
        "steps": [{"worker": "gpt-4o-2024-08-06", "instruction": "solve_" * 120, "access": "all"}],
    },
    separators=(",", ":"),
)
WIDTHS_JS = """() => {
  const root = document.documentElement;
  const wide = [...document.querySelectorAll('main *')]
    .filter((el) => el.getBoundingClientRect().right > root.clientWidth + 1)
    .slice(0, 5)
    .map((el) => el.tagName + (el.id ? '#' + el.id : '') + '.' + el.className + ' ' + Math.round(el.getBoundingClientRect().right));
  return {scroll: root.scrollWidth, client: root.clientWidth, wide};
}"""


@pytest.fixture
def var_dir(settings, tmp_path) -> Path:
    settings.VAR_DIR = tmp_path / "var"  # the live server runs in this process: it reads the same setting
    settings.VAR_DIR.mkdir()
    return settings.VAR_DIR


def long_dataset(var_dir: Path):
    """A dataset whose preview, manifest and filter carry very long unbroken text."""
    from training import services
    from training.models import Dataset

    path = "datasets/long/v1/" + "deep" * 40
    directory = var_dir / path
    directory.mkdir(parents=True)
    item = "gsm8k-" + "9" * 300
    row = {
        "prompt": [
            {"role": "system", "content": "You are the conductor."},
            {"role": "user", "content": "Task: " + LONG + "\n" + "y" * 2000},
        ],
        "item": item,
        "task_id": "0f0f0f0f-0000-4000-8000-000000000001",
        "domain": "gsm8k",
        "group_completions": [LONG_PLAN, LONG, "z" * 240],
        "rewards": [1.0, 0.0, 0.5],
        "advantages": [0.5, -0.5, 0.0],
        "run_ids": [11, 12, 13],
    }
    (directory / "train.jsonl").write_text(
        json.dumps(row) + "\n" + json.dumps({**row, "item": item + "b"}) + "\n"
    )
    for name in services.DATASET_FILES:
        if not (directory / name).exists():
            (directory / name).write_text("{}\n")
    return Dataset.objects.create(
        name="long-" + "n" * 70,
        version=1,
        filter={"items": [item, item + "b", "c" * 500], "batch_ids": list(range(1, 200))},
        counts={"train": 2, "validation": 0, "groups": 2, "completions": 6},
        reward_config={"correctness": 1.0, "cost_penalty_per_usd": 0.0, "format_term": True},
        content_hash="0123456789abcdef" * 4,
        source_run_ids=[11, 12, 13],
        path=path,
    )


def assert_fits(page: Page, url: str, name: str) -> None:
    page.goto(url)
    page.wait_for_load_state("load")
    widths = page.evaluate(WIDTHS_JS)
    assert widths["scroll"] <= WIDTH, f"{name} is {widths['scroll']} px wide at {WIDTH} px: {widths['wide']}"


def test_the_dataset_page_with_very_long_text_fits_a_1400_px_window(page: Page, log_in, var_dir, screenshot):
    dataset = long_dataset(var_dir)
    page.set_viewport_size({"width": WIDTH, "height": 900})
    log_in("mira", Role.ML_STAFF)

    assert_fits(page, f"/training/datasets/{dataset.pk}/", "the dataset page")

    # The long texts are all there, in boxes of their own: wrapped, or scrolled inside the box.
    preview = page.locator("#dataset-preview")
    expect(preview.locator("details").first).to_have_attribute("open", "")
    task = preview.locator("pre.response").first
    expect(task).to_contain_text("Task: xxxx")
    box = task.bounding_box()
    assert box is not None and box["x"] + box["width"] <= WIDTH
    completion = preview.locator("tbody code").first
    expect(completion).to_contain_text('"thought":"aaaa')
    cell = completion.bounding_box()
    assert cell is not None and cell["x"] + cell["width"] <= WIDTH
    # Opening the other groups does not widen the page either.
    for summary in preview.locator("details:not([open]) > summary").all():
        summary.click()
    widths = page.evaluate(WIDTHS_JS)
    assert widths["scroll"] <= WIDTH, widths
    screenshot("training-dataset-long-text")


def test_every_training_page_fits_a_1400_px_window(page: Page, log_in, var_dir, screenshot):
    from routing.models import ConductorVersion
    from routing.services import conductor_active
    from training.models import Evaluation, JobStatus, TrainingJob, TrainingMetric

    dataset = long_dataset(var_dir)
    baseline = conductor_active()
    candidate = ConductorVersion.objects.create(
        name="learned-" + "w" * 60, backend="learned", notes="notes " + "n" * 2000
    )
    job = TrainingJob.objects.create(
        name="learned-" + "j" * 70,
        backend=TrainingJob.Backend.LLM_LORA,
        dataset=dataset,
        options={"base_model_path": "/models/" + "m" * 600, "max_steps": 20, "note": LONG},
        status=JobStatus.CANCELLED,
        step=3,
        total_steps=20,
        log="step 1 " + LONG + "\n",
        error="Traceback: " + LONG,
        artifact_path="adapters/" + "a" * 400,
    )
    TrainingMetric.objects.create(job=job, step=1, values={"reward": 0.5, "loss": 1.0})
    row = {"p95_plan_ms": 3.2, "n": 40, "total": 100, "failed": 0}
    evaluation = Evaluation.objects.create(
        candidate=candidate,
        baseline=baseline,
        split="dev",
        limit=100,
        status=JobStatus.FAILED,
        error="error " + LONG,
        results={
            "candidate": {"version": candidate.name, "accuracy": 0.8, "usd_per_1000": "2.5", **row},
            "baseline": {"version": baseline.name, "accuracy": 0.7, "usd_per_1000": "4.0", **row},
        },
    )
    page.set_viewport_size({"width": WIDTH, "height": 900})
    log_in("mira", Role.ML_STAFF)

    assert_fits(page, "/training/", "the training page")
    screenshot("training-home-long-text")
    assert_fits(page, f"/training/jobs/{job.pk}/", "the job page")
    wait_until(page, "document.body.dataset.curvesReady === '1'")
    assert page.evaluate(WIDTHS_JS)["scroll"] <= WIDTH
    screenshot("training-job-long-text")
    assert_fits(page, f"/training/datasets/{dataset.pk}/", "the dataset page")
    assert_fits(page, f"/training/evaluations/{evaluation.pk}/", "the evaluation page")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    assert page.evaluate(WIDTHS_JS)["scroll"] <= WIDTH
    screenshot("training-evaluation-long-text")


def test_a_job_page_left_open_says_nothing_was_registered_once_the_job_is_cancelled(page: Page, log_in):
    from training.models import JobStatus, TrainingJob

    job = TrainingJob.objects.create(
        name="learned-open", backend=TrainingJob.Backend.LEARNED, status=JobStatus.RUNNING, total_steps=10
    )
    log_in("mira", Role.ML_STAFF)
    page.goto(f"/training/jobs/{job.pk}/")
    expect(page.locator("#job-candidate")).to_have_text("learned-open is registered when the job succeeds")

    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.CANCELLED)  # the page polls every second
    wait_until(page, "document.body.dataset.jobFinished === '1'")
    expect(page.locator("#job-candidate")).to_have_text("none: the job was cancelled, nothing was registered")
    expect(page.locator("#job-status")).to_have_text("Cancelled")


def test_the_versions_table_keeps_names_and_notes_readable_beside_the_actions(page: Page, log_in):
    """With the action buttons kept on one line, "learned-v1" broke into "learn / ed-v1" and a
    one-sentence note took five lines."""
    from routing.models import ConductorVersion

    ConductorVersion.objects.create(
        name="learned-v1", backend="learned", notes="GRPO on 1472 recorded items; mean reward 0.721 -> 0.788"
    )
    page.set_viewport_size({"width": WIDTH, "height": 900})
    log_in("mira", Role.ML_STAFF)
    page.goto("/training/")
    row = page.locator("tr", has=page.locator("strong", has_text="learned-v1"))
    expect(row.locator("td.actions button", has_text="Promote")).to_be_visible()
    lines = "(el) => { const r = document.createRange(); r.selectNodeContents(el); return r.getClientRects().length; }"
    assert row.locator("strong").evaluate(lines) == 1  # the name on one line
    assert row.locator("td.notes").evaluate(lines) <= 3  # the note not a word or two a line
    for button in row.locator("td.actions button").all():  # "Previe / w": no label broken inside its button
        assert button.evaluate(lines) == 1, button.inner_text()


def test_the_format_term_checkbox_sits_beside_its_label(page: Page, log_in):
    """The dataset form's checkboxes stood alone above their labels, which the stacked form's labels put on a
    line of their own."""
    page.set_viewport_size({"width": WIDTH, "height": 900})
    log_in("mira", Role.ML_STAFF)
    page.goto("/training/")
    for name in ("format_term", "human_labels"):
        box = page.locator(f"#dataset-form input[name$={name}]").bounding_box()
        label = page.locator(f"#dataset-form label[for$={name}]").evaluate(
            "(el) => { const r = el.getClientRects()[0]; return {x: r.x + window.scrollX, y: r.y + window.scrollY}; }"
        )
        assert box and label["x"] > box["x"] + box["width"] - 1, (name, box, label)  # to the box's right
        assert label["y"] < box["y"] + box["height"], (name, box, label)  # on the box's line
