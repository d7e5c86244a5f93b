"""Field by field: each value a dossier bundle shows is bound to an event, or the standalone verifier
names it among what it did not prove. Each alteration here passed as intact before the verifier
checked it (the task's cost, answer, status and score against its runs'; a step's status; every step
and attempt an event records present; a purge proven by the runs' signed purges; a bundle that drops
every run)."""

from __future__ import annotations

import copy

import pytest

from tests.audit import test_bundle
from tests.audit.test_bundle import standalone, write

pytestmark = pytest.mark.django_db(transaction=True)

# The bundle of test_bundle: a finished run, leaf 2 of a tree of 6 leaves, and the public key.
leaves_before, exported = test_bundle.leaves_before, test_bundle.exported


def _run(bundle: dict) -> dict:
    return bundle["runs"][0]


def task_cost_changed(bundle):
    bundle["task"]["cost_usd"] = "0.0000001000"


def task_answer_changed(bundle):
    bundle["task"]["final_answer"] = "41"


def task_status_changed(bundle):
    bundle["task"]["status"] = "failed"


def task_score_changed(bundle):
    bundle["task"]["score"] = 1.0


def step_status_changed(bundle):
    _run(bundle)["steps"][0]["status"] = "failed"


def last_step_and_its_attempts_removed(bundle):
    run = _run(bundle)
    step = run["steps"].pop()
    run["attempts"] = [a for a in run["attempts"] if a["step_id"] != step["id"]]


def attempt_status_changed(bundle):
    _run(bundle)["attempts"][0]["status"] = "failed"


def text_replaced_as_if_purged(bundle):
    bundle["task"]["text"] = "[purged]"
    bundle["task"]["purged_at"] = "2026-01-01T00:00:00+00:00"


def every_run_removed(bundle):
    bundle["runs"] = []


def run_kind_changed(bundle):
    _run(bundle)["kind"] = "shadow"


def run_conductor_changed(bundle):
    _run(bundle)["conductor"] = "elsewhere"


def run_status_changed(bundle):
    _run(bundle)["status"] = "running"


def run_score_changed(bundle):
    _run(bundle)["score"] = 0.5


def task_id_changed(bundle):
    bundle["task"]["id"] = "00000000-0000-0000-0000-000000000000"


TAMPERED = {
    task_cost_changed: "the task's cost_usd is '0.0000001000' in the dossier, but its runs' add up to",
    task_answer_changed: "the task's final answer (sha256",
    task_status_changed: "the task is failed in the dossier, but its last own run {run} is succeeded",
    task_score_changed: "the task's score is 1.0 in the dossier, but its answering run's is None",
    step_status_changed: "step {step}'s status is 'failed' in the dossier; its step.succeeded event recorded 'succeeded'",
    last_step_and_its_attempts_removed: "step {last} is recorded by its step.started event, but is not in the dossier",
    attempt_status_changed: "'s status is 'failed' in the dossier; its step.succeeded event recorded 'succeeded'",
    text_replaced_as_if_purged: "but its chain still holds its task.submitted event: it was not purged",
    every_run_removed: "but the bundle carries none of its runs: nothing in it proves that",
    run_kind_changed: "run {run}'s kind is 'shadow' in the dossier; its task.submitted event recorded 'live'",
    run_conductor_changed: "run {run}'s conductor is 'elsewhere' in the dossier; its run.started event recorded",
    run_status_changed: "the run is running in the dossier; its chain records it succeeded",
    run_score_changed: "run {run}'s score is 0.5 in the dossier; its run.succeeded event recorded None",
    task_id_changed: "not of this bundle's task 00000000-0000-0000-0000-000000000000",
}


@pytest.mark.parametrize("tamper", list(TAMPERED), ids=[t.__name__ for t in TAMPERED])
def test_each_field_the_bundle_shows_is_bound_to_an_event(exported, tamper):
    bundle, key, folder = exported
    forged = copy.deepcopy(bundle)
    tamper(forged)
    result = standalone("verify", write(forged, folder, "forged.json"), "--public-key", str(key))
    assert result.returncode == 1, result.stdout + result.stderr
    run = _run(bundle)
    expected = TAMPERED[tamper].format(run=run["id"], step=run["steps"][0]["id"], last=run["steps"][-1]["id"])
    assert expected in result.stdout, result.stdout


def test_the_text_check_is_skipped_only_for_a_purge_the_bundle_proves(exported):
    """A purge claimed with the chain gone but no signed purge in its place is named too."""
    bundle, key, folder = exported
    text_replaced_as_if_purged(bundle)
    _run(bundle)["events"] = []
    result = standalone("verify", write(bundle, folder, "forged.json"), "--public-key", str(key))
    assert result.returncode == 1
    assert "but no signed purge in the bundle proves it" in result.stdout, result.stdout


def test_a_bundle_says_what_it_did_not_prove(exported):
    bundle, key, folder = exported
    result = standalone("verify", write(bundle, folder), "--public-key", str(key))
    assert result.returncode == 0, result.stdout
    listed = result.stdout.split("not proven (no event binds them):\n", 1)[1]
    assert listed.startswith("- exported_at, exported_by: the bundle's own, signed by nothing\n")
    # Proven here, so not listed: the task's text, its totals, the run's kind, conductor and cost.
    for proven in ("the task's text", "the task's cost_usd", "kind", "conductor", "cost_usd"):
        assert proven not in listed, listed
