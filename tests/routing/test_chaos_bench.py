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
    assert (figures["redis_restarts"], figures["postgres_restarts"]) == (1, 1)
    assert figures["steps_with_more_than_one_succeeded_attempt"] == 0
    assert figures["paid_calls_repeated_beyond_the_one_in_flight"] == 0
    assert figures["lost_steps"] == 0
    assert figures["audit_intact"] is True, figures["audit_first_problem"]
    assert not (tmp_path / "var" / "postgres" / "postmaster.pid").exists(), (
        "the harness left its database running"
    )
