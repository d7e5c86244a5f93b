"""The playground: run a task again as a variation (another conductor, or one worker with the task's
text or an edited instruction, from the task or from one of its steps), as a new run of the same task
beside its own runs. Its likely cost is shown before it runs; starting it is audited.

A playground run never answers for its task (its status, answer and score are the live runs'), and
it goes through the engine as every run does: the task's policies, clearance and budgets hold (a
worker a rule withholds is blocked, as in any plan).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from accounts.models import Role
from audit.actions import Action
from audit.services import Actor, event_record
from routing.errors import ServiceError
from routing.estimates import MeanCost, call_cost, mean_cost
from routing.hashing import content_hash
from routing.limits import text_length_check
from routing.models import ConductorVersion, Run, Step, Task, Worker
from routing.services import conductor_active, run_enqueue

PLAYERS = (Role.OPERATOR, Role.ML_STAFF)  # admins pass every role check


class PlaygroundError(ServiceError):
    """A variation that cannot be run as given (400)."""


@dataclass(frozen=True)
class Variation:
    """What to change: a conductor version (its name), or a worker (its slug) with an instruction
    (empty: the task's text); `step_id`: the step it starts from, for the record."""

    task_id: Any
    conductor: str = ""
    worker: str = ""
    instruction: str = ""
    step_id: int | None = None


@dataclass(frozen=True)
class Prepared:
    """A variation checked against the database: what would run, and its estimate."""

    task: Task
    version: ConductorVersion
    plan: dict[str, Any] | None  # one worker's plan; None: the conductor plans
    estimate: MeanCost | None
    step: Step | None

    @property
    def described(self) -> str:
        if self.plan is None:
            return f"conductor {self.version.name} plans it"
        step = self.plan["steps"][0]
        edited = _normalised(step["instruction"]) != _normalised(self.task.text)
        return f"{step['worker']} answers {'an edited instruction' if edited else 'the task'}"

    @property
    def fingerprint(self) -> str:
        """What would run (the conductor, or the plan), as the form shows it priced: posted back with
        "Run it", so that what runs is what was priced, whatever else finished meanwhile."""
        what = {"conductor": self.version.name} if self.plan is None else {"plan": self.plan["steps"]}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def prepare(variation: Variation) -> Prepared:
    """Check a variation (refused with the reason) and price it, without running anything."""
    task = Task.objects.filter(pk=variation.task_id).first()
    if task is None:
        raise PlaygroundError("there is no such task")
    if task.purged_at is not None:
        raise PlaygroundError("its content was deleted under the retention policy: nothing to run")
    if bool(variation.conductor) == bool(variation.worker):
        raise PlaygroundError("choose either a conductor or a worker")
    step = None
    if variation.step_id is not None:
        step = Step.objects.filter(pk=variation.step_id, run__task=task).first()
        if step is None:
            raise PlaygroundError(f"this task has no step {variation.step_id}")
    if variation.conductor:
        version = ConductorVersion.objects.filter(name=variation.conductor).first()
        if version is None:
            raise PlaygroundError(f"there is no conductor version {variation.conductor!r}")
        mean = mean_cost(version)
        return Prepared(task, version, None, mean.shown() if mean else None, step)
    worker = Worker.objects.filter(slug=variation.worker, enabled=True).first()
    if worker is None:
        raise PlaygroundError(f"there is no enabled worker {variation.worker!r}")
    instruction = _normalised(variation.instruction) or task.text
    if "\x00" in instruction:
        raise PlaygroundError("the instruction contains a NUL character, which cannot be stored")
    try:
        text_length_check(instruction)  # the one rule for a task's text holds for an instruction
    except ValidationError as exc:
        raise PlaygroundError(f"the instruction: {' '.join(exc.messages)}") from exc
    plan = {
        "thought": f"playground: {worker.slug} answers, as a user asked",
        "steps": [{"worker": worker.slug, "instruction": instruction, "access": []}],
    }
    return Prepared(task, conductor_active(), plan, call_cost(worker, instruction), step)


def playground_run(*, variation: Variation, user: Any, estimated_usd: Decimal | None) -> Run:
    """Start the variation as a new run of its task (kind playground), with its `task.playground_run`
    event (what was changed, the estimate shown), queued when the transaction commits."""
    with transaction.atomic():
        # Checked under the task's lock: a purge (which takes it) cannot slip in between.
        Task.objects.select_for_update().filter(pk=variation.task_id).first()
        prepared = prepare(variation)
        run = Run.objects.create(
            task=prepared.task,
            conductor_version=prepared.version,
            kind=Run.Kind.PLAYGROUND,
            plan_override=json.dumps(prepared.plan) if prepared.plan is not None else "",
        )
        instruction = prepared.plan["steps"][0]["instruction"] if prepared.plan else ""
        edited = bool(instruction) and _normalised(instruction) != _normalised(prepared.task.text)
        event_record(
            actor=Actor.for_user(user),
            action=Action.TASK_PLAYGROUND_RUN,
            obj=prepared.task,
            task_id=prepared.task.pk,
            correlation_id=run.correlation_id,
            payload={
                "run_id": run.pk,
                "conductor": prepared.version.name if prepared.plan is None else "",
                "worker": variation.worker,
                "instruction_sha256": hashlib.sha256(instruction.encode()).hexdigest() if instruction else "",
                "instruction_edited": edited,
                # The plan it forces, as stored: verification compares the run's row with it.
                "plan_override_sha256": content_hash(run.plan_override),
                "from_step": prepared.step.pk if prepared.step else None,
                "estimated_usd": None if estimated_usd is None else str(estimated_usd),
            },
        )
        transaction.on_commit(lambda: run_enqueue(run_id=run.pk))
    return run


def _normalised(text: str) -> str:
    """Text as a browser's form sends it back: line breaks as LF, ends stripped."""
    return text.replace("\r\n", "\n").strip()
