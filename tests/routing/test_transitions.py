"""The transition table (routing.models.transitions): every status move of a run, task, step or
attempt, and which change may make it. Walked here move by move; an illegal move raises before a
change is written."""

from __future__ import annotations

import itertools

import pytest

from routing.engine.changes import inserted, moved
from routing.models import Attempt, Run, RunStatus, Step, StepStatus, Task
from routing.models.transitions import MOVES, Change, IllegalMove, check_move

STATUSES = {
    Run: [None, *RunStatus.values],
    Task: [None, *RunStatus.values],
    Step: [None, *StepStatus.values],
    Attempt: [None, *Attempt.Status.values],
}


def test_every_move_of_the_table_names_real_statuses_and_changes():
    for (model, before, after), changes in MOVES.items():
        assert before in STATUSES[model] and after in STATUSES[model], (model, before, after)
        assert changes and all(isinstance(c, Change) for c in changes)


@pytest.mark.parametrize("model", list(STATUSES), ids=lambda m: m.__name__)
def test_the_table_walked_every_move_by_every_change(model):
    """Each (from, to) pair by each change: allowed exactly where the table lists it."""
    for before, after in itertools.product(STATUSES[model], STATUSES[model][1:]):
        for change in Change:
            listed = change in MOVES.get((model, before, after), frozenset())
            if listed:
                check_move(model, before, after, change)
            else:
                with pytest.raises(IllegalMove):
                    check_move(model, before, after, change)


def test_an_ended_run_never_moves_again():
    for ended in (RunStatus.SUCCEEDED, RunStatus.FAILED):
        for after in RunStatus.values:
            assert not MOVES.get((Run, ended, after)), (ended, after)


def test_a_settled_step_or_attempt_never_moves_again():
    for settled in (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED):
        assert not [key for key in MOVES if key[0] is Step and key[1] == settled]
    for settled in Attempt.Status.values:
        if settled != Attempt.Status.STARTED:
            assert not [key for key in MOVES if key[0] is Attempt and key[1] == settled]


def test_a_change_built_with_an_illegal_move_raises_before_anything_is_written():
    step = Step(status=StepStatus.SUCCEEDED)
    with pytest.raises(IllegalMove, match="Step may not move from succeeded to running by step started"):
        moved(step, Change.STEP_STARTED, status=StepStatus.RUNNING)
    with pytest.raises(IllegalMove, match="from nothing to succeeded"):
        inserted(Attempt(status=Attempt.Status.SUCCEEDED), Change.STEP_STARTED)
    # a legal one is a plain row update
    update = moved(Step(status=StepStatus.PENDING), Change.STEP_STARTED, status=StepStatus.RUNNING)
    assert update.values == {"status": StepStatus.RUNNING}


def test_every_change_that_moves_a_status_is_in_the_table():
    named = {change for changes in MOVES.values() for change in changes}
    assert set(Change) - named == {Change.CONDUCTOR_CALL_FAILED}  # an event, no status of its own
