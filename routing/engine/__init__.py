"""The engine: plan a run, execute its steps as a DAG, recurse through the conductor, enforce budgets.

Resumable by construction. Every call's outcome is committed before the next one starts, so a run
taken over by another worker process (the first was killed) skips the steps that already succeeded:
no paid call is made twice. A call that was in flight when its process died is recorded as `lost`
and made again. A PostgreSQL advisory lock, held on its own connection for the life of an execution,
makes sure only one process executes a run at a time; the lock dies with the process, and each claim
raises an epoch that fences off any process whose claim is no longer current.

A run's life, module by module, in the order it happens:
- `execute`: the entry point (lock, claim, plan, steps, end);
- `locks`: the run's advisory lock on a connection of its own, and the keeper of its heartbeat;
- `claim`: the claim transition (a new epoch, its event);
- `planning`: the conductor asked for a plan, and asked again with the error of an invalid one;
- `plan_record`: the plan transition (checked against the policy rules, recorded with its steps);
- `schedule`: the plan's steps as a DAG, independent ones concurrently;
- `step_start`: the step-start transition (its checks, its messages, its first attempt);
- `calls`: what a step is sent, and the provider call itself;
- `step_settle`: the transitions of a call's outcome (success, retry, the step's failure);
- `recursion`: a conductor step that plans again one level deeper;
- `run_end`: the run-end transition (answer, score, totals, the seals);
- `run_failure`: the failure transition (every step settled, the seals).
What the transitions write through: `execution` (the run as this process executes it, and the
errors), `fence` (the claim's check, and the one interface of fast and plain writes), `statement`
(one statement for one write), `events` (the events' fields and who hears of them), `task_totals`
(the task's row when a run ends) and `workers` (the enabled workers as of their stamp).
"""

from .calls import WORKER_SYSTEM_PROMPT, build_messages
from .execute import execute_run
from .execution import INFRASTRUCTURE_ERRORS, ClaimLost, InfrastructureError, RunExecution, RunStopped
from .locks import (
    ADVISORY_LOCK_NAMESPACE,
    advisory_lock,
    advisory_lock_connection,
    advisory_locked,
    run_is_locked,
    run_lock,
)

__all__ = [
    "ADVISORY_LOCK_NAMESPACE",
    "INFRASTRUCTURE_ERRORS",
    "WORKER_SYSTEM_PROMPT",
    "ClaimLost",
    "InfrastructureError",
    "RunExecution",
    "RunStopped",
    "advisory_lock",
    "advisory_lock_connection",
    "advisory_locked",
    "build_messages",
    "execute_run",
    "run_is_locked",
    "run_lock",
]
