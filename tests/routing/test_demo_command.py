"""`manage.py demo` stops everything it started on Ctrl-C or SIGTERM; `services stop` stops what a killed
demo left running. Real processes: the demo, daphne, two Celery workers (with their pool processes), beat."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from conductor_web import embedded
from tests.conftest import ROOT, database_url, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

GRACE_S = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _cmdline(proc: psutil.Process) -> str:
    """A process's command line, or "" for one that ended or is a zombie meanwhile (the demo starts
    short-lived children too: the local model's install steps)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Demo:
    proc: subprocess.Popen
    port: int
    var_dir: Path
    output: Path
    env: dict[str, str]
    started: list[psutil.Process]  # every process it started, pool processes included

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def left_running(self) -> list[str]:
        return [line for p in self.started if _alive(p) and (line := _cmdline(p))]


def _logged_ready(var_dir: Path) -> bool:
    logs = [var_dir / "log" / name for name in ("worker.log", "training-worker.log")]
    return all(log.exists() and " ready." in log.read_text(errors="replace") for log in logs)


@pytest.fixture
def start_demo(transactional_db, tmp_path):
    from django.conf import settings

    from routing.models import Attempt, ConductorVersion

    # A learned conductor exists, so the demo skips its one-time training (tens of seconds).
    ConductorVersion.objects.create(name="learned-test", backend=ConductorVersion.Backend.LEARNED)
    prefix = f"demotest{os.getpid()}-"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CONDUCTOR_VAR_DIR": str(tmp_path / "var"),
        "CONDUCTOR_QUEUE_PREFIX": prefix,  # its workers and beat keep to queues of their own
        "PYTHONUNBUFFERED": "1",
    }
    demos: list[Demo] = []

    def start(*, count: int = 0, busy: bool = False, local_model: bool = False) -> Demo:
        """busy: a worker is in the middle of a run (its warm shutdown would wait minutes for it).
        local_model: the demo brings up the local model too (its server found already answering)."""
        port = _free_port()
        output = tmp_path / f"demo-{len(demos)}.out"
        with open(output, "wb") as out:
            # A session of its own, like a shell job: a Ctrl-C goes to its whole process group.
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "demo", "--count", str(count), "--port", str(port)]
                + ["--concurrency", "1", "--grace", str(GRACE_S)]
                # The local model's server outlives a demo, as PostgreSQL and Redis do: tested below.
                + ([] if local_model else ["--no-local-model"]),
                cwd=ROOT,
                env={**env, "CONDUCTOR_REPLAY_LATENCY_S": "300"} if busy else env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        demo = Demo(proc, port, tmp_path / "var", output, env, [])
        demos.append(demo)

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the demo exited ({proc.returncode}):\n{demo.log()}")
            if not (_answers(port) and _logged_ready(demo.var_dir)):
                return False
            if busy:  # a provider call is under way (the replay pool answers after 300 s)
                return Attempt.objects.filter(status=Attempt.Status.STARTED).exists()
            return "Serving" in demo.log()

        wait_for(ready, timeout=240, interval=0.5, what="the demo to serve")
        demo.started = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(_cmdline(p) for p in demo.started)
        assert "daphne" in names and " beat " in names and names.count(" worker ") >= 4, names
        return demo

    yield start
    for demo in demos:  # whatever a failed test left behind
        for proc in [*demo.started, psutil.Process(demo.proc.pid) if demo.proc.poll() is None else None]:
            if proc is not None and _alive(proc):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            demo.proc.wait(10)
    from conductor_web.celery import app

    with app.connection_for_write() as conn:
        for queue in (prefix + "runs", prefix + "training"):
            with contextlib.suppress(Exception):
                conn.default_channel.queue_delete(queue)


def _assert_all_stopped(demo: Demo) -> None:
    wait_for(lambda: not demo.left_running(), timeout=10, what="every started process to exit")
    assert not _answers(demo.port), "the web server still answers"
    assert not list((demo.var_dir / "run").glob("*.json")), "process records were left behind"


def test_ctrl_c_stops_web_workers_and_beat_even_with_a_run_in_flight(start_demo):
    demo = start_demo(count=1, busy=True)  # Ctrl-C while the batch runs: a worker will not finish soon

    # A server recorded under var/ that outlives a demo, as the local model's does.
    server = subprocess.Popen(["sleep", "120"], start_new_session=True)
    embedded.process_record(demo.var_dir, "local-model-server", server.pid, group=True)

    os.killpg(demo.proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: its foreground group

    # The busy worker's warm shutdown would wait for the run: it is killed once the grace period is over.
    try:
        demo.proc.wait(GRACE_S + 12)
        assert "Stopping" in demo.log()
        # What it leaves running is said, with the way to stop it.
        assert f"Still running under {demo.var_dir}: local-model-server" in demo.log()
        assert "`make stop` stops them" in demo.log()
        assert server.poll() is None
    finally:
        embedded.processes_stop(demo.var_dir, ["local-model-server"], grace=1)
    _assert_all_stopped(demo)


def test_sigterm_stops_web_workers_and_beat(start_demo):
    demo = start_demo()

    demo.proc.send_signal(signal.SIGTERM)  # `kill PID`, or make passing on its own SIGTERM

    demo.proc.wait(GRACE_S + 30)
    _assert_all_stopped(demo)


def test_the_demo_says_when_the_local_model_is_up_and_free_text_works(start_demo, local_model_server):
    demo = start_demo(local_model=True)

    wait_for(lambda: "Local model up at" in demo.log(), timeout=120, what="the local model to be said up")
    log = demo.log()
    assert "Local model (SmolLM2-135M on llama.cpp's server): coming up in the background" in log
    assert log.index("coming up in the background") < log.index("Local model up at")
    assert f"Local model up at {local_model_server} after " in log
    assert "free text works now (worker smollm2-135m-local; its answers are labelled weak)." in log
    demo.proc.send_signal(signal.SIGTERM)
    demo.proc.wait(GRACE_S + 30)
    _assert_all_stopped(demo)


def test_services_stop_stops_what_a_killed_demo_left_running(start_demo):
    demo = start_demo()
    demo.proc.kill()
    demo.proc.wait(10)
    assert _answers(demo.port) and demo.left_running()  # orphans: only the records know them now

    result = subprocess.run(
        [sys.executable, "manage.py", "services", "stop", "--grace", str(GRACE_S)],
        cwd=ROOT,
        env=demo.env,
        capture_output=True,
        text=True,
        timeout=GRACE_S + 60,
    )

    assert result.returncode == 0, result.stderr
    assert "web" in result.stdout and "worker" in result.stdout, result.stdout
    _assert_all_stopped(demo)


def test_services_stop_stops_the_local_model_server(tmp_path, local_model_server):
    from conductor_web import embedded, local_model

    var_dir = tmp_path / "var"
    api = local_model.start(var_dir, port=_free_port())
    pid = embedded.process_running(var_dir, local_model.PROCESS_NAME)
    assert pid and local_model.healthy(api)
    assert local_model.state_read(var_dir)["state"] == "up"

    stopped = embedded.stop(var_dir, grace=5)

    assert local_model.PROCESS_NAME in stopped
    assert not local_model.healthy(api)
    with contextlib.suppress(psutil.NoSuchProcess):  # gone: stopped
        assert not _alive(psutil.Process(pid))
    assert not list((var_dir / "run").glob("*.json"))


# --- the records `services stop` reads ------------------------------------------------------------------


@pytest.mark.django_db(transaction=False)
def test_a_recorded_group_is_stopped_whole_and_a_reused_pid_is_left_alone(tmp_path):
    from conductor_web import embedded

    def start() -> tuple[subprocess.Popen, psutil.Process]:
        # A leader with a child in its group, like a Celery worker and its pool process.
        leader = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
        child = wait_for(lambda: psutil.Process(leader.pid).children(), what="the child")[0]
        return leader, child

    ours, ours_child = start()
    embedded.process_record(tmp_path, "ours", ours.pid, group=True)
    theirs, theirs_child = start()
    embedded.process_record(tmp_path, "theirs", theirs.pid, group=True)
    # As if the recorded program had exited and its pid now led another one's group, started later.
    record = tmp_path / "run" / "theirs.json"
    data = json.loads(record.read_text())
    record.write_text(
        json.dumps({**data, "cmdline": ["another", "program"], "started": data["started"] - 100})
    )
    try:
        assert embedded.process_running(tmp_path, "ours") == ours.pid
        assert embedded.process_running(tmp_path, "theirs") is None

        assert embedded.processes_stop(tmp_path, grace=5) == ["ours"]

        ours.wait(5)
        assert not _alive(ours_child)
        assert theirs.poll() is None and _alive(theirs_child)
        assert not list((tmp_path / "run").glob("*.json"))
    finally:
        for proc in (ours, theirs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
