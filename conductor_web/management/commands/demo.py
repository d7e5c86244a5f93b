"""The main job on the embedded default: set up, start web and worker, run a batch of replay tasks."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Avg, Count, Sum

from conductor_web import embedded
from conductor_web.celery import beat_command, worker_command
from conductor_web.local_model_progress import LocalModelProgress, started_line
from routing.models import ConductorVersion, Run, RunStatus, Step, Task

# Started with the others, but done once it has done its work: its end is no failure of the demo.
ONE_SHOT = {"local-model"}


class Command(BaseCommand):
    help = (
        "Migrate, load the replay pool, start the web server (daphne) and a Celery worker, submit a batch of "
        "recorded benchmark tasks and report on them; then keep serving until Ctrl-C (or SIGTERM), which stops "
        "everything it started. `manage.py services stop` stops what a killed demo left running."
    )
    stopping = False  # a first Ctrl-C / SIGTERM was received: stopping what was started
    hurry = False  # a second one: SIGKILL now instead of waiting for the grace period
    deferring = False  # starting a service: a stop waits until it is recorded, so that it is stopped too
    stop_requested = False
    local_model: tuple[subprocess.Popen, LocalModelProgress] | None = None  # brought up in the background

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=30, help="replay tasks to submit")
        parser.add_argument("--split", default="dev")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes")
        parser.add_argument("--exit", action="store_true", help="stop web and worker once the batch is done")
        parser.add_argument(
            "--no-local-model",
            action="store_true",
            help="do not bring up the local model (SmolLM2-135M on llama.cpp's server) beside the demo",
        )
        parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the batch")
        parser.add_argument(
            "--grace",
            type=float,
            default=10,
            help="seconds web and workers get to stop on Ctrl-C before they are killed (SIGKILL)",
        )

    def handle(self, *args, **o):
        var_dir = settings.VAR_DIR
        running = embedded.process_running(var_dir, "demo")
        if running:
            raise CommandError(
                f"a demo is already running under {var_dir} (pid {running}); `make stop` stops it"
            )
        leftovers = embedded.processes_stop(var_dir, grace=o["grace"])
        if leftovers:
            self.stderr.write(f"stopped what an earlier demo left running: {', '.join(leftovers)}")
        # Web, workers and beat run in process groups of their own, out of the terminal's reach: a Ctrl-C
        # (SIGINT to the terminal's foreground group) or a SIGTERM reaches this process only, which stops
        # each of them as a whole group, in order, and kills what does not stop within the grace period.
        handlers = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        procs: dict[str, subprocess.Popen] = {}
        embedded.process_record(var_dir, "demo", os.getpid(), group=False)
        try:
            self._run(o, procs)
        except KeyboardInterrupt:
            self.stdout.write("\nStopping...")
        finally:
            self._stop(procs, o["grace"])
            embedded.process_forget(var_dir, "demo")
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        self._say_what_keeps_running(var_dir)

    def _say_what_keeps_running(self, var_dir) -> None:
        """The servers under var/ outlive the demo (the CLI and the next demo use them): say which, and how
        to stop them."""
        left = embedded.still_running(var_dir)
        if left:
            self.stdout.write(
                f"Stopped the web server, workers and beat. Still running under {var_dir}: {', '.join(left)} "
                "(manage.py commands and the next demo use them); `make stop` stops them."
            )

    def _on_signal(self, signum, frame) -> None:
        if self.stopping:
            self.hurry = True
        elif self.deferring:
            self.stop_requested = True
        else:
            self.stopping = True
            raise KeyboardInterrupt

    def _stop(self, procs: dict[str, subprocess.Popen], grace: float) -> None:
        self.stopping = True
        embedded.processes_stop(settings.VAR_DIR, list(procs), grace=grace, hurry=lambda: self.hurry)
        for proc in procs.values():
            if proc.poll() is None:  # its record could not be written or matched
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def _run(self, o: dict, procs: dict[str, subprocess.Popen]) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("load_replay_pool", verbosity=0)
        self._learned_default()
        username, password = self._admin()
        env = {**os.environ, "DATABASE_URL": settings.DATABASE_URL, "REDIS_URL": settings.REDIS_URL}
        log_dir = settings.VAR_DIR / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        services = {
            "worker": worker_command(concurrency=o["concurrency"]),
            # Training jobs get a process of their own, so that runs never wait behind one.
            # It takes housekeeping too (the resume sweep, checkpoints), which thus never waits for a run.
            "training-worker": worker_command(
                concurrency=1, queues=("maintenance", "training"), hostname="training@%h"
            ),
            "beat": beat_command(schedule=str(settings.VAR_DIR / "celerybeat-schedule")),
            "web": [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                o["host"],
                "-p",
                str(o["port"]),
                "conductor_web.asgi:application",
            ],
        }
        # The local model comes up beside the demo, which starts on the replay pool and does not wait:
        # the first time, its server's wheel is built (minutes); the live overview says how far it is.
        if not o["no_local_model"]:
            services["local-model"] = [sys.executable, "manage.py", "local_model", "up"]
        for name, command in services.items():
            self.deferring = True
            try:
                procs[name] = self._spawn(name, command, env, log_dir / f"{name}.log")
            finally:
                self.deferring = False
            if self.stop_requested:
                self.stopping = True
                raise KeyboardInterrupt
        if "local-model" in procs:
            log_path = log_dir / "local-model.log"
            self.local_model = (procs["local-model"], LocalModelProgress(settings.VAR_DIR, log_path=log_path))
            self.stdout.write(started_line(log_path))
        started = time.monotonic()
        before = set(Task.objects.values_list("pk", flat=True))
        call_command("submit_replay_batch", split=o["split"], count=o["count"], prefix="demo", verbosity=0)
        batch = Task.objects.filter(idempotency_key__startswith=f"demo:{o['split']}:")
        new = batch.exclude(pk__in=before).count()
        self.stdout.write(
            f"Submitted {new} new replay tasks ({batch.count()} in the demo batch); running them..."
        )
        self._wait(batch, o["timeout"])
        self._report(batch, time.monotonic() - started if new else None)
        call_command("audit_checkpoint")
        url = f"http://{o['host']}:{o['port']}/"
        self.stdout.write(self.style.SUCCESS(f"\nOpen {url} and log in as {username} / {password}"))
        self.stdout.write(f"Logs: {log_dir}")
        if o["exit"]:
            return
        self.stdout.write("Serving; press Ctrl-C to stop.")
        if self.local_model and not self.local_model[1].done:
            self.stdout.write("Free text waits for the local model: this terminal says when it is up.")
        while True:
            self._local_model_news()
            for name, proc in procs.items():
                if name in ONE_SHOT:
                    proc.poll()  # reaped once it ends: no zombie left behind
                    continue
                if proc.poll() is not None:
                    raise CommandError(
                        f"{name} stopped (exit status {proc.returncode}); see {log_dir / (name + '.log')}"
                    )
            time.sleep(1)

    def _local_model_news(self) -> None:
        """How far the local model is, when that changed (or a step lasts): printed as it happens."""
        if self.local_model is not None:
            proc, progress = self.local_model
            for line in progress.news(proc.poll()):
                self.stdout.write(line)

    def _learned_default(self) -> None:
        """The learned conductor is the default: trained on the replay pool's train split on first run."""
        if ConductorVersion.objects.filter(backend=ConductorVersion.Backend.LEARNED).exists():
            return
        self.stdout.write("Training the learned conductor on the recorded train split (once)...")
        call_command("train_conductor", "learned-v1", "--activate", stdout=self.stdout)

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str], log_path) -> subprocess.Popen:
        """Start a service in a process group (and session) of its own, and record it for `services stop`."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=settings.BASE_DIR,
                start_new_session=True,
            )
        embedded.process_record(settings.VAR_DIR, name, proc.pid, group=True)
        return proc

    def _admin(self) -> tuple[str, str]:
        username = os.environ.get("CONDUCTOR_ADMIN_USER", "admin")
        password_file = settings.VAR_DIR / "admin_password"
        user_model = get_user_model()
        if not user_model.objects.filter(username=username).exists():
            password = os.environ.get("CONDUCTOR_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
            user_model.objects.create_superuser(username=username, email="", password=password)
            password_file.write_text(password)
            password_file.chmod(0o600)
        password = password_file.read_text().strip() if password_file.exists() else "(set earlier)"
        return username, password

    def _wait(self, batch, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        total = batch.count()
        last = -1
        while time.monotonic() < deadline:
            done = batch.filter(status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]).count()
            if done != last:
                self.stdout.write(f"  {done}/{total} done")
                last = done
            if done == total:
                return
            self._local_model_news()
            time.sleep(0.5)
        self.stderr.write(f"the batch did not finish within {timeout:.0f}s; see var/log/worker.log")

    def _report(self, batch, elapsed: float | None) -> None:
        runs = Run.objects.filter(task__in=batch, kind=Run.Kind.LIVE)
        summary = batch.aggregate(tasks=Count("pk"), accuracy=Avg("score"), cost=Sum("cost_usd"))
        failed = batch.filter(status=RunStatus.FAILED).count()
        steps = Step.objects.filter(run__in=runs).count()
        self.stdout.write(
            f"\n{summary['tasks']} tasks, {failed} failed, accuracy {summary['accuracy'] or 0:.3f}, "
            f"{steps} steps, total ${summary['cost'] or 0:.4f} "
            f"(USD {((summary['cost'] or 0) / max(summary['tasks'], 1)) * 1000:.2f} per 1,000 tasks)"
        )
        if elapsed:
            self.stdout.write(f"wall time {elapsed:.1f}s, {steps / elapsed:.1f} steps/s")
