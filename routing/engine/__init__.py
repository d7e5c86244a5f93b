"""The engine: plan a run, execute its steps as a DAG, recurse through the conductor, enforce budgets.

Resumable by construction. Every call's outcome is committed before the next one starts, so a run
taken over by another worker process (the first was killed) skips the steps that already succeeded:
no paid call is made twice. A call that was in flight when its process died is recorded as `lost`
and made again. A PostgreSQL advisory lock, held on its own connection for the life of an execution,
makes sure only one process executes a run at a time; the lock dies with the process, and each claim
raises an epoch that fences off any process whose claim is no longer current.

A run's life, module by module:
- `claim`: the lock, the keeper, the claim, and `execute_run`, the entry point;
- `planning`: the conductor's plan, checked (allowed workers, policy rules, budgets) and recorded;
- `schedule`: the plan's steps as a DAG, independent ones concurrently;
- `calls`: what a step is sent and the calls to its worker, retried with backoff, each an attempt row;
- `recursion`: a conductor step that plans again one level deeper;
- `finish`: the answer, its score, the totals and the seal of the run's audit chain, or the failure;
- `record`: what all of them write through (the audit event that fences the claim, cost roll-up).
"""

from .calls import WORKER_SYSTEM_PROMPT, build_messages
from .claim import (
    ADVISORY_LOCK_NAMESPACE,
    advisory_lock,
    advisory_lock_connection,
    advisory_locked,
    execute_run,
    run_is_locked,
    run_lock,
)
from .record import INFRASTRUCTURE_ERRORS, Fenced, InfrastructureError, RunStopped

__all__ = [
    "ADVISORY_LOCK_NAMESPACE",
    "INFRASTRUCTURE_ERRORS",
    "WORKER_SYSTEM_PROMPT",
    "Fenced",
    "InfrastructureError",
    "RunStopped",
    "advisory_lock",
    "advisory_lock_connection",
    "advisory_locked",
    "build_messages",
    "execute_run",
    "run_is_locked",
    "run_lock",
]
