"""Which status moves are legal, and by which change: one table for runs, tasks, steps and attempts.

The engine writes every status through a change (routing.engine.changes), and each row a change
writes is checked here when the change is built (`check_move`): a move the table does not list
raises IllegalMove, before anything is written. `None` as the `from` status is a row inserted with
that status. The test suite walks the table (tests/routing/test_transitions.py).
"""

from __future__ import annotations

from enum import StrEnum

from .runs import Attempt, Run, RunStatus, Step, StepStatus, Task


class Change(StrEnum):
    """The engine's state changes, by name: what a move of the table is made by."""

    CLAIM = "claim"
    CONDUCTOR_CALL_FAILED = "conductor call failed"
    PLAN_RECORDED = "plan recorded"
    STEP_STARTED = "step started"
    ATTEMPT_STARTED = "attempt started"
    ATTEMPT_FAILED = "attempt failed"
    STEP_SUCCEEDED = "step succeeded"
    STEP_FAILED = "step failed"
    RUN_SUCCEEDED = "run succeeded"
    RUN_FAILED = "run failed"


class IllegalMove(Exception):
    """A change tried to move a row's status where the table does not let it."""


_Q, _R, _S, _F = RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED
_ATTEMPT_FAILURES = tuple(
    s
    for s in Attempt.Status
    if s not in (Attempt.Status.STARTED, Attempt.Status.SUCCEEDED, Attempt.Status.LOST)
)

# (model, from, to) -> the changes that may make that move.
MOVES: dict[tuple[type, str | None, str], frozenset[Change]] = {
    # A run: claimed (again, after its process died), then ended.
    (Run, _Q, _R): frozenset({Change.CLAIM}),
    (Run, _R, _R): frozenset({Change.CLAIM}),  # a resumed delivery's claim
    (Run, _R, _S): frozenset({Change.RUN_SUCCEEDED}),
    (Run, _R, _F): frozenset({Change.RUN_FAILED}),
    # The task of a live run (or its retry) follows its run.
    (Task, _Q, _R): frozenset({Change.CLAIM}),
    (Task, _Q, _S): frozenset({Change.RUN_SUCCEEDED}),
    (Task, _Q, _F): frozenset({Change.RUN_FAILED}),
    (Task, _R, _S): frozenset({Change.RUN_SUCCEEDED}),
    (Task, _R, _F): frozenset({Change.RUN_FAILED}),
    # A retry of a task that had ended: its run's end is the task's again.
    (Task, _S, _S): frozenset({Change.RUN_SUCCEEDED}),
    (Task, _S, _F): frozenset({Change.RUN_FAILED}),
    (Task, _F, _S): frozenset({Change.RUN_SUCCEEDED}),
    (Task, _F, _F): frozenset({Change.RUN_FAILED}),
    # A step: recorded with its plan, started, settled; or settled with its run's end.
    (Step, None, StepStatus.PENDING): frozenset({Change.PLAN_RECORDED}),
    (Step, StepStatus.PENDING, StepStatus.RUNNING): frozenset({Change.STEP_STARTED}),
    (Step, StepStatus.RUNNING, StepStatus.RUNNING): frozenset({Change.STEP_STARTED}),  # resumed
    (Step, StepStatus.RUNNING, StepStatus.PENDING): frozenset({Change.CLAIM}),  # its process died
    (Step, StepStatus.RUNNING, StepStatus.SUCCEEDED): frozenset({Change.STEP_SUCCEEDED}),
    (Step, StepStatus.PENDING, StepStatus.FAILED): frozenset({Change.STEP_FAILED}),  # refused at its start
    (Step, StepStatus.RUNNING, StepStatus.FAILED): frozenset(
        {Change.STEP_FAILED, Change.RUN_SUCCEEDED, Change.RUN_FAILED}
    ),
    (Step, StepStatus.PENDING, StepStatus.SKIPPED): frozenset({Change.RUN_SUCCEEDED, Change.RUN_FAILED}),
    # An attempt: started, then settled; or lost with the process that made it.
    (Attempt, None, Attempt.Status.STARTED): frozenset({Change.STEP_STARTED, Change.ATTEMPT_STARTED}),
    (Attempt, Attempt.Status.STARTED, Attempt.Status.SUCCEEDED): frozenset({Change.STEP_SUCCEEDED}),
    (Attempt, Attempt.Status.STARTED, Attempt.Status.LOST): frozenset({Change.CLAIM}),
    **{(Attempt, Attempt.Status.STARTED, s): frozenset({Change.ATTEMPT_FAILED}) for s in _ATTEMPT_FAILURES},
}


def check_move(model: type, before: str | None, after: str, by: Change) -> None:
    """Raise IllegalMove unless the table lets `by` move a row of `model` from `before` to `after`."""
    if by not in MOVES.get((model, before, after), frozenset()):
        raise IllegalMove(f"{model.__name__} may not move from {before or 'nothing'} to {after} by {by}")
