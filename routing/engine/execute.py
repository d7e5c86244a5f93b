"""The entry point: take the run's lock, claim the run, plan it, run its steps, end it."""

from __future__ import annotations

import logging

from utilities import structured_logs

from ..models import StopReason
from ..secrets import redact
from .claim import claim_run
from .execution import INFRASTRUCTURE_ERRORS, ClaimLost, InfrastructureError, RunExecution, RunStopped
from .locks import Keeper, run_lock
from .planning import ensure_plan
from .run_end import finish_run, holds_last_step
from .run_failure import fail_run
from .schedule import schedule_steps

log = logging.getLogger(__name__)


def execute_run(run_id: int) -> None:
    """Claim a run and execute it. Raises InfrastructureError when the database failed under it."""
    try:
        with run_lock(run_id) as lock:
            if lock is None:
                log.info("run %s is being executed by another process; leaving it", run_id)
                return
            execution = claim_run(run_id)
            if execution is None:
                return
            with structured_logs.bound(execution.run), Keeper(lock, execution):
                _live(execution)
            lock.release_later = True  # the run ended: its lock goes with the next one taken
    except ClaimLost as lost:
        log.warning("%s", lost)
    except INFRASTRUCTURE_ERRORS as exc:
        raise InfrastructureError(f"run {run_id}: {type(exc).__name__}: {exc}") from exc


def _live(execution: RunExecution) -> None:
    """The claimed run's life: its plan, its steps, its end (with its last step's success, in one
    change, where it can be) or its failure."""
    run = execution.run
    try:
        root = ensure_plan(execution, parent_step=None, depth=0)
        finish_run(execution, schedule_steps(execution, root, hold_last=holds_last_step(run)))
    except RunStopped as stop:
        fail_run(execution, str(stop), stop.stop_reason)
    except (ClaimLost, *INFRASTRUCTURE_ERRORS):
        raise  # not the run's failure: nothing may (or can) be written; the next delivery resumes it
    except Exception as exc:
        # A bug: leave a clear failed state rather than a run stuck in "running".
        log.exception("run %s failed unexpectedly", run.pk)
        fail_run(execution, redact(f"internal error: {type(exc).__name__}: {exc}"), StopReason.INTERNAL)
        raise
