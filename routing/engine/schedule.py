"""The DAG of a plan: steps run as soon as the steps they see have succeeded, independent ones
concurrently (up to CONDUCTOR_STEP_CONCURRENCY calls in flight).

One thread writes: the engine's, on the run's connection. It starts each ready step (one transaction:
the step, its first attempt, the event), hands the provider call to a pool thread, which makes it
and nothing else, and records each outcome as it comes back. In a sequence, the step a success makes
ready starts in the transaction that records that success: a step of a sequence costs one transaction
after its call. A step alone in the DAG at its turn is called on the engine's thread itself. A
conductor step (a nested plan) runs on the engine's thread while its siblings' calls are in flight.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.conf import settings

from ..models import Step, StepStatus, StopReason
from .calls import Call, Sent, call_metadata, dependencies, send
from .changes import Change
from .execution import Assumed, RunExecution, RunStopped
from .executor import apply
from .plan_record import RecordedPlan
from .step_settle import Success, settle
from .step_start import begin_retry, begin_step, first_call, starts_with_the_last, step_started

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scheduled:
    """A plan's steps done: its last step (its response is the plan's answer), and, when its success
    was held for the change that ends the run (`hold_last`), that success, not yet recorded."""

    step: Step
    held: Success | None = None


def schedule_steps(execution: RunExecution, recorded: RecordedPlan, *, hold_last: bool = False) -> Scheduled:
    """Run the plan's steps; independent steps run concurrently. Raises RunStopped on failure.
    `hold_last`: the success of the plan's last step, when every other has succeeded and nothing is in
    flight, is not recorded here but returned, for the run's end to record with it (one change)."""
    return _Schedule(execution, recorded, hold_last).run()


class _Schedule:
    """One plan's steps as they run: which are done, which busy (a call in flight, or its backoff), the
    calls pending, and the first error (after which nothing new starts, and what is in flight ends)."""

    def __init__(self, execution: RunExecution, recorded: RecordedPlan, hold_last: bool) -> None:
        self.execution, self.hold_last = execution, hold_last
        self.held: Success | None = None
        # The plan's steps as recorded (their workers with them), or read back (a resumed run, a plan
        # recorded by an earlier delivery).
        planned = recorded.steps
        if planned is None:
            planned = list(recorded.decision.steps.select_related("worker"))
        self.steps = {s.index: s for s in planned}
        self.with_plan: dict[int, Call] = dict(recorded.begun)  # started with the plan
        self.done = {i for i, s in self.steps.items() if s.status == StepStatus.SUCCEEDED}
        self.busy: set[int] = set()
        self.ready: list[int] = []
        self.pending: dict[Future[Any], Call] = {}  # a call being sent, or waiting out its backoff
        self.first_error: RunStopped | None = None
        self.pool = _Share(settings.CONDUCTOR_STEP_CONCURRENCY)

    def run(self) -> Scheduled:
        try:
            while True:
                if self._start_ready():
                    continue  # a conductor step answered: the steps that see it may be ready
                if not self.pending:
                    break
                finished, _ = wait(self.pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    call = self.pending.pop(future)
                    try:
                        self._came_back(call, future.result())
                    except RunStopped as stop:
                        self.first_error = self.first_error or stop
        finally:
            self.pool.cancel_waiting()  # on the way out with an error: what never started is not started now
            wait(list(self.pending))  # no call of the run is left in flight when it returns, or raises
        if self.first_error is not None:
            raise self.first_error
        if len(self.done) != len(self.steps):  # pragma: no cover - the schedule always reaches every step
            raise RunStopped("some steps could not be scheduled", stop_reason=StopReason.INTERNAL)
        return Scheduled(self.steps[max(self.steps)], self.held)

    def _start(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if not self.pending and not self.ready:  # nothing else to do meanwhile: here, on this thread
            return _now(fn, *args)
        # The pool thread logs and traces with the run's ids (utilities.structured_logs): a copy of this context.
        return self.pool.submit(contextvars.copy_context().run, fn, *args)

    def _send(self, call: Call) -> None:
        self.busy.add(call.step.index)
        self.pending[self._start(send, call, call_metadata(self.execution))] = call

    def _start_ready(self) -> bool:
        """Start every step whose turn it is (a conductor step, last, on this thread). True when a
        conductor step answered."""
        self.ready = _ready(self.steps, self.done, self.busy) if self.first_error is None else []
        nested = False
        while self.ready and self.first_error is None:
            step = self.steps[self.ready.pop(0)]
            visible = [self.steps[i] for i in dependencies(step)]
            try:
                if step.is_conductor:  # last of the ready: its siblings' calls go out first
                    _conductor_step(self.execution, step, visible)
                    self.done.add(step.index)
                    nested = True
                    continue
                call = self.with_plan.pop(step.index, None) or begin_step(self.execution, step, visible)
                self._send(call)
            except RunStopped as stop:
                self.first_error = stop
        return nested

    def _came_back(self, call: Call, outcome: Any) -> None:
        """A call's outcome (Sent), or the end of its backoff (then its next attempt)."""
        if not isinstance(outcome, Sent):
            if self.first_error is None:  # else the run is stopping: the step is settled with the run
                call = begin_retry(self.execution, call)
                self.pending[self._start(send, call, call_metadata(self.execution))] = call
            return
        index = call.step.index
        if self._holds(call, outcome):
            self.held = Success.of(call, outcome)
            self.done.add(index)
            self.busy.discard(index)
            return
        # A sequence: the one step whose turn this success makes starts in its change.
        follower = (
            _follower(self.steps, self.done | {index}, self.busy - {index}) if not self.pending else None
        )
        with_next = None
        if follower is not None and self.first_error is None and outcome.error is None:
            with_next = partial(_follower_started, self.execution, self.steps, follower, index)
        change = settle(self.execution, call, outcome, with_next=with_next)
        if change is None:
            self.pending[self._start(time.sleep, call.delay_s)] = call  # back off, then try again
            return
        self.done.add(index)
        self.busy.discard(index)
        if with_next is not None:
            if change.stops is not None:
                raise change.stops
            self._send(change.result[1])

    def _holds(self, call: Call, outcome: Sent) -> bool:
        """The plan's last step succeeded, every other had: its success is held for the run's end."""
        return (
            self.hold_last
            and outcome.error is None
            and not self.pending
            and self.first_error is None
            and call.step.index == max(self.steps)
            and len(self.done) == len(self.steps) - 1
        )


class _Share:
    """A run's share of the process's step threads (STEP_THREADS): at most `limit` of its calls at
    once, the rest queued in order. The threads are the process's, started once: a pool started for
    each run cost more than the calls it made side by side."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.running = 0
        self.waiting: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self.mutex = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self.mutex:
            go = self.running < self.limit
            if go:
                self.running += 1
            else:
                self.waiting.append((future, fn, args))
        if go:
            self._go(future, fn, args)
        return future

    def _go(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            inner = STEP_THREADS.pool().submit(fn, *args)
        except BaseException as exc:  # noqa: BLE001 - no thread to run it (the interpreter is exiting)
            done: Future[Any] = Future()
            done.set_exception(exc)
            self._done(future, done)
            return
        inner.add_done_callback(partial(self._done, future))

    def cancel_waiting(self) -> None:
        """Calls not yet handed to a thread are not made (the run is stopping)."""
        with self.mutex:
            waiting, self.waiting = list(self.waiting), deque()
        for future, _, _ in waiting:
            future.cancel()

    def _done(self, future: Future[Any], inner: Future[Any]) -> None:
        error = inner.exception()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(inner.result())
        with self.mutex:
            following = self.waiting.popleft() if self.waiting else None
            if following is None:
                self.running -= 1
        if following is not None:
            self._go(*following)


class StepThreads:
    """The process's threads for provider calls made side by side (they touch no database): made as
    needed, kept, made again in a forked child (threads do not survive a fork)."""

    MAX = 64  # across the runs of a process; each run is held to CONDUCTOR_STEP_CONCURRENCY (_Share)

    def __init__(self) -> None:
        self._forked()

    def _forked(self) -> None:
        """Afresh (in a forked child, the parent's threads are not its own)."""
        self._pool: ThreadPoolExecutor | None = None
        self._mutex = threading.Lock()

    def pool(self) -> ThreadPoolExecutor:
        with self._mutex:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.MAX, thread_name_prefix="steps")
            return self._pool


STEP_THREADS = StepThreads()
os.register_at_fork(after_in_child=STEP_THREADS._forked)


def _ready(steps: dict[int, Step], done: set[int], busy: set[int]) -> list[int]:
    """Steps whose turn it is, worker steps first."""
    return [
        index
        for index, step in sorted(steps.items(), key=lambda kv: (kv[1].is_conductor, kv[0]))
        if index not in done and index not in busy and all(dep in done for dep in dependencies(step))
    ]


def _follower(steps: dict[int, Step], done: set[int], busy: set[int]) -> Step | None:
    """The step to start with the last one's success: the only one ready, if it `starts_with_the_last`."""
    ready = _ready(steps, done, busy)
    if len(ready) == 1 and starts_with_the_last(steps[ready[0]]):
        return steps[ready[0]]
    return None


def _follower_started(
    execution: RunExecution,
    steps: dict[int, Step],
    follower: Step,
    answered: int,
    assumed: Assumed,
    done: Change,
) -> Change:
    """The start of the step a success makes ready, applied with that success (`done`, whose answer
    its messages quote)."""
    answer = next(u.values["response"] for u in done.updates if u.obj is steps[answered])
    visible = [steps[i] for i in dependencies(follower)]
    return step_started(execution, first_call(follower), visible, {answered: answer}, assumed)


def _now(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """A future already done: fn called here."""
    future: Future[Any] = Future()
    try:
        future.set_result(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the future, as the pool would
        future.set_exception(exc)
    return future


def _conductor_step(execution: RunExecution, step: Step, visible: list[Step]) -> None:
    """A conductor step: started, then its nested plan (on this thread); its answer read back."""
    from .recursion import execute_conductor_step  # cycle: a nested plan runs as a DAG too (schedule)

    start_step(execution, step, visible)
    execute_conductor_step(execution, step)
    step.refresh_from_db(fields=["status", "response"])


def start_step(execution: RunExecution, step: Step, visible: list[Step]) -> None:
    """A conductor step running (worker steps start with their first attempt: step_start.begin_step)."""
    apply(execution, partial(step_started, execution, None, visible, {}, step=step))
