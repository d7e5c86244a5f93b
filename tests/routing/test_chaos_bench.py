"""The chaos harness runs end to end (tiny counts): its own services, workers, beat, a kill and both
restarts, and reports every figure. Its figures at full size are in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_the_chaos_harness_ends_every_run_and_reports_its_figures(tmp_path):
    out = tmp_path / "chaos.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CONDUCTOR_VAR_DIR")}
    command = [
        sys.executable,
        "-m",
        "bench.chaos",
        "--runs",
        "4",
        "--child-kills",
        "1",
        "--worker-kills",
        "0",
    ]
    command += ["--redis-restarts", "1", "--postgres-restarts", "1", "--every", "2", "--deadline", "150"]
    command += ["--var-dir", str(tmp_path / "var"), "--json", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["runs"] == figures["terminal_runs"] == 4
    assert figures["lost_runs"] == 0, figures["lost_run_details"]
    assert (figures["redis_restarts"], figures["postgres_restarts"]) == (1, 1)
    assert figures["steps_with_more_than_one_succeeded_attempt"] == 0
    assert figures["paid_calls_repeated_beyond_the_one_in_flight"] == 0
    assert figures["lost_steps"] == 0
    assert figures["audit_intact"] is True, figures["audit_first_problem"]
    assert not (tmp_path / "var" / "postgres" / "postmaster.pid").exists(), (
        "the harness left its database running"
    )


@pytest.mark.django_db
def test_a_run_that_did_not_end_is_named_with_its_state_and_the_log_lines_about_it(tmp_path):
    from bench.chaos import lost_runs
    from routing.models import Task
    from routing.services import TaskSubmission, task_submit

    ended, _ = task_submit(submission=TaskSubmission(text="Chaos task chaos-1"), source=Task.Source.API)
    stuck, _ = task_submit(submission=TaskSubmission(text="Chaos task chaos-2"), source=Task.Source.API)
    ended_run, stuck_run = ended.runs.get(), stuck.runs.get()
    ended_run.__class__.objects.filter(pk=ended_run.pk).update(status="succeeded")
    (tmp_path / "worker-1.log").write_text(
        f"run {stuck_run.pk}: OperationalError the database system is shutting down; retrying in 1.0s\n"
        f"run {stuck_run.pk}0: someone else\n"
    )

    lost = lost_runs([ended_run.pk, stuck_run.pk], tmp_path)

    assert len(lost) == 1
    assert lost[0].startswith(f"run {stuck_run.pk} (task {stuck.pk}): queued, 0 deliveries")
    assert "task.submitted" in lost[0] and "shutting down" in lost[0]
    assert "someone else" not in lost[0]
