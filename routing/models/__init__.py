"""Routing data: the worker pool, conductor versions, tasks, runs, decisions, steps and attempts.

Money is Decimal (USD, 10 decimal places: a single cheap call costs fractions of a cent).
Every total on a Step, Run or Task is the exact sum of the rows beneath it, written by the
engine in the same transaction as the row that changed it.

One module per part of the schema: `pool` (workers, conductor versions), `runs` (tasks and what
a run records), `rollups` (what the aggregate pages read), `saved_views`, and `money` (the Decimal
fields' sizes). Every name is re-exported here: `from routing.models import Run` is how the rest of
the code, and the migrations, name them.
"""

from __future__ import annotations

from .money import (
    ROLLUP_USD,
    USD,
    ZERO,
)
from .pool import (
    SLUG_VALIDATOR,
    ConductorVersion,
    DataClass,
    Worker,
    default_data_classes,
)
from .rollups import (
    Grain,
    OpsRollup,
    PendingRollup,
    RunRollup,
    TaskExposure,
    UsageRollup,
)
from .runs import (
    CONDUCTOR_SLUG,
    RUN_ENDED,
    Annotation,
    Attempt,
    Decision,
    Run,
    RunStatus,
    Step,
    StepStatus,
    StopReason,
    Task,
)
from .saved_views import (
    SavedView,
)

__all__ = [
    "Annotation",
    "Attempt",
    "CONDUCTOR_SLUG",
    "ConductorVersion",
    "DataClass",
    "Decision",
    "Grain",
    "OpsRollup",
    "PendingRollup",
    "ROLLUP_USD",
    "RUN_ENDED",
    "Run",
    "RunRollup",
    "RunStatus",
    "SLUG_VALIDATOR",
    "SavedView",
    "Step",
    "StepStatus",
    "StopReason",
    "Task",
    "TaskExposure",
    "USD",
    "UsageRollup",
    "Worker",
    "ZERO",
    "default_data_classes",
]
