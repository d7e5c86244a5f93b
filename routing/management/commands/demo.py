"""The main job on the embedded default: set up, start web and worker, run a batch of replay tasks."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db.models import Avg, Count, Sum

from conductor_web.celery import worker_command
from routing.models import ConductorVersion, Run, RunStatus, Step, Task


class Command(BaseCommand):
    help = (
        "Migrate, load the replay pool, start the web server (daphne) and a Celery worker, submit a batch of "
        "recorded benchmark tasks and report on them; then keep serving until Ctrl-C."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=30, help="replay tasks to submit")
        parser.add_argument("--split", default="dev")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes")
        parser.add_argument("--exit", action="store_true", help="stop web and worker once the batch is done")
        parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the batch")

    def handle(self, *args, **o):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("load_replay_pool", verbosity=0)
        self._learned_default()
        username, password = self._admin()
        env = {**os.environ, "DATABASE_URL": settings.DATABASE_URL, "REDIS_URL": settings.REDIS_URL}
        log_dir = settings.VAR_DIR / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        procs = [
            self._spawn(worker_command(concurrency=o["concurrency"]), env, log_dir / "worker.log"),
            # Training jobs get a process of their own, so that runs never wait behind one.
            self._spawn(
                worker_command(concurrency=1, queues=("training",), hostname="training@%h"),
                env,
                log_dir / "training-worker.log",
            ),
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "conductor_web",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "--schedule",
                    str(settings.VAR_DIR / "celerybeat-schedule"),
                ],
                env,
                log_dir / "beat.log",
            ),
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "-b",
                    o["host"],
                    "-p",
                    str(o["port"]),
                    "conductor_web.asgi:application",
                ],
                env,
                log_dir / "web.log",
            ),
        ]
        try:
            started = time.monotonic()
            before = set(Task.objects.values_list("pk", flat=True))
            call_command(
                "submit_replay_batch", split=o["split"], count=o["count"], prefix="demo", verbosity=0
            )
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
            while all(p.poll() is None for p in procs):
                time.sleep(1)
            self.stderr.write("a service stopped; see the logs above")
        except KeyboardInterrupt:
            pass
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def _learned_default(self) -> None:
        """The learned conductor is the default: trained on the replay pool's train split on first run."""
        if ConductorVersion.objects.filter(backend=ConductorVersion.Backend.LEARNED).exists():
            return
        self.stdout.write("Training the learned conductor on the recorded train split (once)...")
        call_command("train_conductor", "learned-v1", "--activate", stdout=self.stdout)

    def _spawn(self, cmd: list[str], env: dict[str, str], log_path) -> subprocess.Popen:
        log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=settings.BASE_DIR)

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
