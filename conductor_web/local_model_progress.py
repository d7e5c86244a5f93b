"""What the demo's terminal says of the local model while it comes up in the background: each step of
its installation and start as its state file records it (conductor_web.local_model), a line every few
minutes while a step lasts (the first build takes long), and the moment it is up and free text works,
or why it failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from conductor_web import local_model
from routing.local_pool import WORKER_SLUG
from routing.local_server import BUILD_TIME, state_reason

REMIND_EVERY_S = 300.0  # a step that lasts (the first build): said again this often, with the time so far


def started_line(log_path: Path) -> str:
    return (
        "Local model (SmolLM2-135M on llama.cpp's server): coming up in the background; the first time on "
        f"this machine its server is built ({BUILD_TIME}). The recorded benchmark items run meanwhile; free "
        f"text waits for it, and this terminal says when it works. Its log: {log_path}"
    )


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class LocalModelProgress:
    """Call news() every second or so with the exit status of `manage.py local_model up` (None while
    it runs); print the lines it returns."""

    def __init__(self, var_dir: Path, *, log_path: Path, clock: Callable[[], float] = time.monotonic):
        self.var_dir = var_dir
        self.log_path = log_path
        self.clock = clock
        self.started = self.reminded = clock()
        self.seen: tuple[object, object] | None = None
        self.done = False  # up, or failed: nothing more to say

    def news(self, returncode: int | None) -> list[str]:
        if self.done:
            return []
        record = local_model.state_read(self.var_dir) or {}
        now = self.clock()
        if returncode is not None:
            self.done = True
            return [self._ended(returncode, record, now)]
        state = (record.get("state"), record.get("step"))
        if state[0] in ("installing", "starting") and state != self.seen:
            self.seen, self.reminded = state, now
            return [f"Local model: {self._doing(record)}..."]
        if self.seen is not None and now - self.reminded >= REMIND_EVERY_S:
            self.reminded = now
            return [f"Local model: still {self._doing(record)} ({_minutes(now - self.started)} so far)"]
        return []

    @staticmethod
    def _doing(record: dict) -> str:
        if record.get("state") == "starting":
            return "its server is loading the model"
        return str(record.get("step") or "installing")

    def _ended(self, returncode: int, record: dict, now: float) -> str:
        took = _minutes(now - self.started)
        if returncode == 0:
            return (
                f"Local model up at {record.get('api_base') or '?'} after {took}: free text works now "
                f"(worker {WORKER_SLUG}; its answers are labelled weak)."
            )
        reason = state_reason(record) if record.get("state") == "failed" else ""
        return (
            f"Local model failed after {took}: {reason or f'exit status {returncode}'}; see {self.log_path}. "
            "Free text has no worker until `manage.py local_model up` brings it up."
        )
