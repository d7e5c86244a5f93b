"""Defects of the training pages, through Django's test client: an evaluation's partial results, what a
job's page says of its candidate version in each status, and a dataset filter that has an "items" key."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts.models import Role
from audit.models import AuditEvent
from audit.services import Actor
from audit.templatetags.display import plain, settings_text
from routing.models import ConductorVersion, Run, RunStatus
from routing.services import conductor_active
from routing.signals import run_finished
from training import services
from training.models import Dataset, EvaluationRun, JobStatus, TrainingJob

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def ml(make_user) -> Client:
    client = Client()
    client.force_login(make_user("mira", Role.ML_STAFF))
    return client


def row_cells(html: str, side: str) -> dict[str, str]:
    """The text of the cells of a side's row of the evaluation table, by their data-col."""
    row = html.split(f'<tr data-side="{side}">')[1].split("</tr>")[0]
    return {col: text.strip() for col, text in re.findall(r'data-col="(\w+)">([^<]*)<', row)}


# --- 1. An evaluation part-way: n is the items scored so far -------------------------------------


def finish(links: list[EvaluationRun], score: float | None, status: str = RunStatus.SUCCEEDED) -> None:
    for link in links:
        run = link.run
        run.status, run.score, run.cost_usd, run.finished_at = status, score, Decimal("0.002"), timezone.now()
        run.save(update_fields=["status", "score", "cost_usd", "finished_at"])


def test_a_running_evaluation_shows_n_as_the_items_scored_so_far(ml, replay_pool):
    baseline = conductor_active()
    candidate = ConductorVersion.objects.create(name="static-v2", backend="static", config=baseline.config)
    evaluation = services.evaluation_start(
        candidate=candidate, split="dev", limit=10, actor=Actor.service("test")
    )  # the runs are queued on commit: this test's transaction never commits, nothing runs them
    links = list(EvaluationRun.objects.filter(evaluation=evaluation).select_related("run").order_by("pk"))
    total = len(evaluation.items)
    assert total == 10 and len(links) == 2 * total
    by_side = {side: [link for link in links if link.side == side] for side in ("candidate", "baseline")}
    finish(by_side["candidate"][:3], 1.0)  # 3 of 10 done, all right: accuracy 1.000 over n = 3
    finish(by_side["baseline"][:1], 1.0)
    finish(by_side["baseline"][1:2], None, RunStatus.FAILED)  # a failed run counts, as wrong

    response = ml.get(reverse("training:evaluation", args=[evaluation.pk]))

    html = response.content.decode()
    assert 'data-refresh="1"' in html
    assert row_cells(html, "candidate") == {"n": "3", "done": f"3 of {total} done"}
    assert row_cells(html, "baseline") == {"n": "2", "done": f"2 of {total} done"}
    sides = {row["side"]: row for row in response.context["sides"]}
    assert (sides["candidate"]["accuracy"], sides["baseline"]["accuracy"]) == (1.0, 0.5)
    assert sides["candidate"]["usd_per_1000"] == sides["baseline"]["usd_per_1000"] == "2.0000"
    assert "over the n items scored so far" in html.split('id="evaluation-partial"')[1]
    chart = json.loads(
        html.split('<script id="evaluation-data" type="application/json">')[1].split("</script>")[0]
    )
    assert [(p["side"], p["n"], p["total"]) for p in chart] == [
        ("candidate", 3, total),
        ("baseline", 2, total),
    ]

    # The API says the same, and the evaluation is still running.
    data = ml.get(f"/api/training/evaluations/{evaluation.pk}/").json()
    assert data["status"] == "running"
    assert {side: (r["n"], r["total"], r["accuracy"]) for side, r in data["results"].items()} == {
        "candidate": (3, total, 1.0),
        "baseline": (2, total, 0.5),
    }

    # Reading wrote nothing: the evaluation finishes when its last run ends, not when a page is read.
    evaluation.refresh_from_db()
    assert evaluation.status == JobStatus.RUNNING and not evaluation.results
    assert not AuditEvent.objects.filter(action="evaluation.finished").exists()

    # Every run ended (the engine announces the last one's end): n is the total, and it has finished.
    finish(by_side["candidate"][3:] + by_side["baseline"][2:], 0.0)
    with transaction.atomic():
        run_finished.send(sender=Run, run=by_side["baseline"][-1].run, now=timezone.now())
    response = ml.get(reverse("training:evaluation", args=[evaluation.pk]))
    html = response.content.decode()
    assert row_cells(html, "candidate") == {"n": str(total), "done": f"{total} of {total} done"}
    assert 'data-refresh="0"' in html and 'id="evaluation-partial"' not in html
    evaluation.refresh_from_db()
    assert evaluation.status == JobStatus.SUCCEEDED
    assert evaluation.results["candidate"]["accuracy"] == pytest.approx(0.3)


# --- 3. A job's candidate version, as each status makes it true ----------------------------------


@pytest.mark.parametrize(
    ("status", "cancel_requested", "says", "never"),
    [
        (
            JobStatus.CANCELLED,
            False,
            "the job was cancelled, nothing was registered",
            "when the job succeeds",
        ),
        (JobStatus.FAILED, False, "the job failed, nothing was registered", "when the job succeeds"),
        (JobStatus.QUEUED, False, "learned-c is registered when the job succeeds", "nothing was registered"),
        (JobStatus.RUNNING, False, "learned-c is registered when the job succeeds", "nothing was registered"),
        (
            JobStatus.RUNNING,
            True,
            "nothing is registered unless the job succeeds first",
            "nothing was registered",
        ),
    ],
)
def test_the_job_page_says_what_became_of_the_candidate_version(ml, status, cancel_requested, says, never):
    job = TrainingJob.objects.create(
        name="learned-c",
        backend=TrainingJob.Backend.LEARNED,
        status=status,
        cancel_requested=cancel_requested,
    )
    html = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    cell = html.split('id="job-candidate">')[1].split("</dd>")[0]
    assert says in cell and never not in cell
    progress = ml.get(reverse("training:job-progress", args=[job.pk])).json()
    assert progress["candidate"] is None and says in progress["candidate_note"]  # what the live page writes


def test_a_succeeded_jobs_page_links_its_registered_version(ml):
    version = ConductorVersion.objects.create(name="learned-d", backend="learned")
    job = TrainingJob.objects.create(
        name="learned-d", backend=TrainingJob.Backend.LEARNED, status=JobStatus.SUCCEEDED, candidate=version
    )
    html = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    cell = html.split('id="job-candidate">')[1].split("</dd>")[0]
    assert f'href="{reverse("training:home")}#version-{version.pk}"' in cell and ">learned-d</a>" in cell
    assert "registered when" not in cell and "nothing" not in cell
    progress = ml.get(reverse("training:job-progress", args=[job.pk])).json()
    assert progress["candidate"]["name"] == "learned-d" and progress["candidate_note"] == ""


def test_the_frontier_table_shows_each_points_gate_and_a_dash_for_a_policy_saved_before_gates(ml):
    """A point's gate: its z, "never" (saved as None), or a dash for a policy saved before the gate's
    threshold was kept (it was not chosen per penalty then)."""

    def point(penalty: float, **gate) -> dict:
        return {
            "cost_penalty_per_usd": penalty,
            "accuracy": 0.7,
            "usd_per_1000": 1.0,
            "on_frontier": True,
            "learned_kinds": [],
            **gate,
        }

    frontier = {
        "folds": 3,
        "items": 60,
        "chosen": 20.0,
        "fixed": [],
        "points": [point(3.0, gate_z=1.0), point(20.0, gate_z=None), point(200.0)],
    }
    version = ConductorVersion.objects.create(
        name="learned-g", backend="learned", config={"frontier": frontier}
    )
    job = TrainingJob.objects.create(
        name="learned-g", backend=TrainingJob.Backend.LEARNED, status=JobStatus.SUCCEEDED, candidate=version
    )
    html = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    body = html.split('id="frontier-points"')[1].split("</tbody>")[0]
    gates = [re.findall(r"<td[^>]*>(.*?)</td>", row)[4] for row in body.split("<tr")[2:]]
    assert gates[0] == "1" and gates[2] == '<span class="muted">—</span>'
    assert ">never</span>" in gates[1]


# --- The dataset page's filter: a filter has an "items" key -------------------------------------


@pytest.mark.parametrize("items", [["gsm8k-1", "gsm8k-22"], None])
def test_the_dataset_page_lists_a_filter_that_has_items(ml, settings, tmp_path, items):

    settings.VAR_DIR = tmp_path
    selection = services.DatasetFilter(batch_ids=[4, 5], items=items, min_group_size=3).as_dict()
    dataset = Dataset.objects.create(
        name="filtered", version=1, filter=selection, content_hash="0" * 64, path="datasets/filtered/v1"
    )
    response = ml.get(reverse("training:dataset", args=[dataset.pk]))
    assert response.status_code == 200
    table = response.content.decode().split('id="dataset-filter">')[1].split("</table>")[0]
    rows = dict(re.findall(r"<tr><th>(\w+)</th><td>([^<]*)</td></tr>", table))
    assert rows["batch_ids"] == "[4, 5]" and rows["min_group_size"] == "3"
    assert rows["items"] == ("[&#x27;gsm8k-1&#x27;, &#x27;gsm8k-22&#x27;]" if items else "None")


def test_the_job_page_shows_settings_and_its_log_as_a_person_reads_them_not_as_python_prints_them(ml):
    """The settings showed `limit = None`, and the trainer's log `{'folds': 3, 'limit': None}` (its own test:
    tests/training/test_jobs.py)."""
    options = {"folds": 3, "limit": None, "split": "train", "penalties": [0.0, 3.5], "shadow": False}
    job = TrainingJob.objects.create(
        name="learned-s", backend=TrainingJob.Backend.LEARNED, status=JobStatus.RUNNING, options=options
    )
    html = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    settings_row = html.split("<dt>Settings</dt>")[1].split("</dd>")[0]
    assert "limit = none" in settings_row and "penalties = 0, 3.5" in settings_row
    assert "shadow = no" in settings_row
    assert "None" not in settings_row
    # A learned job's steps are its epochs: "40/40 steps" sat beside "epochs = 40".
    assert re.search(r'<span id="job-step">0/0</span> <span class="muted">epochs</span>', html)
    assert (
        settings_text(options)
        == "folds = 3 · limit = none · split = train · penalties = 0, 3.5 · shadow = no"
    )
    assert (
        plain({"cruxeval-o": "cascade(a, b)", "gsm8k": "single(c)"})
        == "cruxeval-o → cascade(a, b); gsm8k → single(c)"
    )
