"""Planning: ask the conductor for a plan, check it (parse, allowed workers, policy rules, budgets),
retry an invalid one with the error shown, and record the decision with its steps.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from django.conf import settings

from audit import policies
from audit.actions import Action

from .. import replay
from ..conductors import Conductor, ConductorUnavailable, PlanRequest, Proposal, WorkerCard, conductor_load
from ..models import (
    Decision,
    Run,
    Step,
    StopReason,
    Task,
    Worker,
)
from ..models.transitions import Change as By
from ..plans import MAX_STEPS, Plan, PlanError, parse_plan
from ..providers import REPLAY_PROVIDER, ProviderCallError
from .calls import backoff, last_response_before, visible_steps
from .changes import Change, Event
from .execution import Assumed, RunExecution, RunStopped
from .executor import apply
from .plan_record import PlanAnswer, RecordedPlan, record_plan
from .workers import workers_as_of

log = logging.getLogger(__name__)


NO_WORKER_ANSWERS = (
    "no worker can answer this task: the replay pool answers only the benchmark items it recorded, and "
    "no live worker is registered (the local model registers itself once its server is up: "
    "`manage.py local_model up`); retry the task then"
)

PLAN_TRIES = 2  # an invalid plan is retried once with the error shown to the conductor


def screened_workers(
    task: Task, rules: list[policies.PolicyRule] | None = None, workers: list[Worker] | None = None
) -> tuple[list[Worker], dict[str, policies.Verdict]]:
    """Enabled workers the task's data may go to, and those its policies withhold (with the rule),
    under `rules` (the active rules read now when not given); of `workers` (the enabled ones, read
    now when not given)."""
    if workers is None:
        workers = list(Worker.objects.filter(enabled=True).order_by("slug"))
    return policies.screen(answering(task, workers), task.classification, rules)


def answering(task: Task, workers: list[Worker]) -> list[Worker]:
    """The workers that can answer the task: a replay worker only for a benchmark item it recorded an
    answer to (the task's item, or a task whose text is one), every other worker always. A replay
    worker is never offered what it cannot answer, so free text never becomes a vendor's error."""
    if not any(w.litellm_model.startswith(f"{REPLAY_PROVIDER}/") for w in workers):
        return workers
    item = replay.find_item(item_id=task.source_item or None, texts=[task.text])
    recorded = set(item.outcomes) if item is not None else set()
    return [
        w
        for w in workers
        if not w.litellm_model.startswith(f"{REPLAY_PROVIDER}/")
        or w.litellm_model.removeprefix(f"{REPLAY_PROVIDER}/") in recorded
    ]


def plan_request(
    task: Task, workers: list[Worker], *, remaining_steps: int, depth: int, **extra: Any
) -> PlanRequest:
    """What the conductor is asked for a task: the one place its prompt's inputs are put together,
    for the engine's plans and for training's GRPO prompts (training.services.conductor_prompt)."""
    return PlanRequest(
        task_text=task.text,
        domain=task.domain,
        workers=[WorkerCard.of(w) for w in workers],
        max_steps=min(MAX_STEPS, remaining_steps),
        may_recurse=depth < task.max_depth,
        **extra,
    )


def _offerable_workers(
    task: Task, rules: list[policies.PolicyRule], enabled: list[Worker] | None = None
) -> tuple[list[Worker], dict[str, policies.Verdict]]:
    if enabled is None:
        enabled = list(Worker.objects.filter(enabled=True).order_by("slug"))
    workers, withheld = screened_workers(task, rules, enabled)
    if enabled and not workers and not withheld:  # none withheld by a rule: none could answer
        raise RunStopped(NO_WORKER_ANSWERS, stop_reason=StopReason.NO_RECORDED_ANSWER)
    if not workers:
        reasons = "; ".join(f"{v.worker}: {v.rule}" for v in withheld.values()) or "no enabled workers"
        raise RunStopped(
            f"no enabled worker may receive {task.classification} data ({reasons})",
            stop_reason=StopReason.POLICY_BLOCKED if withheld else StopReason.NO_WORKERS,
        )
    return workers, withheld


def _steps_used(run: Run) -> int:
    return Step.objects.filter(run=run).count()


def ensure_plan(execution: RunExecution, *, parent_step: Step | None, depth: int) -> RecordedPlan:
    """The valid plan for this level of the run, asking the conductor if there is none yet."""
    run = execution.run
    decisions = Decision.objects.filter(run=run, parent_step=parent_step)
    # A run's first delivery has no decisions and no steps yet: nothing to look up for its first plan.
    first = parent_step is None and not execution.resumed
    valid = None if first else decisions.filter(valid=True).first()
    if valid is not None:
        return RecordedPlan(valid)
    task = run.task
    rules = known_rules(execution)
    # The workers as of the claim's stamp (a first delivery's claim reads it), else read now.
    workers, withheld = _offerable_workers(task, rules, list(known_workers(execution).values()))
    remaining = task.max_steps - (0 if first else _steps_used(run))
    if remaining <= 0:
        raise RunStopped(
            f"step budget of {task.max_steps} reached before planning", stop_reason=StopReason.STEP_BUDGET
        )
    parent_context = _parent_context(parent_step)
    conductor, load_ms = conductor_load(run.conductor_version)
    tries = 0 if first else decisions.count()
    last_blocked = ""  # the rule that blocked the last plan, if one did
    feedback = "" if first else decisions.order_by("-attempt").values_list("error", flat=True).first() or ""
    asked = False
    while tries < PLAN_TRIES:
        tries += 1
        if asked:  # rules may have changed while the conductor answered: offer what they allow now
            rules = policies.active_rules()
            workers, withheld = _offerable_workers(task, rules)
        asked = True
        request = plan_request(
            task,
            workers,
            remaining_steps=remaining,
            depth=depth,
            feedback=feedback,
            temperature=run.temperature,
            seed=run.pk * 100 + depth * 10 + tries,
            **parent_context,
        )
        if run.plan_override and parent_step is None:
            # A trainer's sampled plan: executed as written, never re-asked (an invalid one is its reward).
            proposal = Proposal(raw_output=run.plan_override)
        else:
            proposal = _propose(execution, conductor, request)
            proposal.latency_ms += load_ms  # a conductor built for this plan: the run waited for it
            load_ms = 0
        plan, error = _parsed(proposal, request, withheld, nested=parent_step is not None)
        answer = PlanAnswer(parent_step, depth, tries, proposal, plan, error, request, workers, withheld)
        recorded = record_plan(execution, answer)
        if recorded.decision.valid:
            return recorded
        feedback = recorded.decision.error
        last_blocked = recorded.decision.blocked_by
        if run.plan_override and parent_step is None:
            if last_blocked:  # it names a worker a rule withholds: stopped by the policy, as any plan
                raise RunStopped(
                    f"the given plan was blocked; {feedback}", stop_reason=StopReason.POLICY_BLOCKED
                )
            raise RunStopped(f"the given plan is invalid: {feedback}", stop_reason=StopReason.INVALID_PLAN)
    if last_blocked:
        raise RunStopped(
            f"the conductor's plan was blocked twice; {feedback}", stop_reason=StopReason.POLICY_BLOCKED
        )
    raise RunStopped(
        f"the conductor's plan was invalid twice; last error: {feedback}", stop_reason=StopReason.INVALID_PLAN
    )


def _parent_context(parent_step: Step | None) -> dict[str, Any]:
    """What a nested plan's conductor is shown of the step it answers for."""
    if parent_step is None:
        return {}
    return {
        "parent_plan": parent_step.decision.plan,
        "last_response": last_response_before(parent_step),
        "visible_responses": tuple(s.response for s in visible_steps(parent_step)),
    }


def _parsed(
    proposal: Proposal, request: PlanRequest, withheld: dict[str, policies.Verdict], *, nested: bool
) -> tuple[Plan | None, str]:
    """The conductor's answer parsed, or None and why not. Withheld workers parse, so that a plan
    naming one is recorded as blocked by its rule."""
    try:
        plan = parse_plan(
            proposal.raw_output,
            allowed_workers=set(request.allowed_slugs) | set(withheld),
            max_steps=request.max_steps,
            allow_empty=nested,
        )
    except PlanError as exc:
        return None, str(exc)
    return plan, ""


def _propose(execution: RunExecution, conductor: Conductor, request: PlanRequest) -> Proposal:
    """Ask the conductor, retrying timeouts, 429 and 5xx like any provider call; each failure is audited."""
    run = execution.run
    made = 0
    while True:
        execution.claim_current()
        try:
            return conductor.propose(request)
        except ConductorUnavailable as exc:
            raise RunStopped(str(exc), stop_reason=StopReason.CONDUCTOR_UNAVAILABLE) from exc
        except ProviderCallError as exc:
            made += 1
            apply(execution, partial(conductor_call_failed, run, made, exc))
            if not exc.retryable or made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS:
                raise RunStopped(
                    f"the conductor could not be reached after {made} attempt(s): {exc}",
                    stop_reason=StopReason.CONDUCTOR_UNAVAILABLE,
                ) from exc
            time.sleep(backoff(made, exc.retry_after))


def conductor_call_failed(run: Run, attempt: int, exc: ProviderCallError, assumed: Assumed) -> Change:
    """The conductor's call failed (it is made again, or the run stops: RunStopped)."""
    payload = {"attempt": attempt, "status": exc.status, "http_status": exc.http_status, "error": str(exc)}
    return Change(by=(By.CONDUCTOR_CALL_FAILED,), events=(Event(Action.CONDUCTOR_CALL_FAILED, run, payload),))


def known_rules(execution: RunExecution) -> list[policies.PolicyRule]:
    """The policy rules as of the stamp this process last read under the run's lock: read from the
    database only when they changed since this process last read them."""
    assumed = execution.assumed
    return policies.rules_as_of(assumed.rules_stamp) if assumed is not None else policies.active_rules()


def known_workers(execution: RunExecution) -> dict[str, Worker]:
    """The enabled workers by slug, as of the stamp this process last read under the run's lock."""
    assumed = execution.assumed
    return workers_as_of(assumed.workers_stamp if assumed is not None else None)
