"""Planning: ask the conductor for a plan, check it (parse, allowed workers, policy rules, budgets),
retry an invalid one with the error shown, and record the decision with its steps.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction

from audit import policies
from audit.actions import Action

from .. import replay
from ..conductors import Conductor, ConductorUnavailable, PlanRequest, Proposal, WorkerCard, conductor_load
from ..models import (
    CONDUCTOR_SLUG,
    Decision,
    Run,
    Step,
    StopReason,
    Task,
    Worker,
)
from ..plans import MAX_STEPS, Plan, PlanError, parse_plan
from ..providers import REPLAY_PROVIDER, ProviderCallError
from .calls import backoff, begin_with_plan, last_response_before, visible_steps
from .record import (
    Fence,
    RunStopped,
    Writes,
    claim_current,
    known_rules,
    known_workers,
    next_ids,
    record_event,
    write_once,
)

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


def ensure_plan(run: Run, *, parent_step: Step | None, depth: int) -> Decision:
    """The valid decision for this level of the run, asking the conductor if there is none yet."""
    decisions = Decision.objects.filter(run=run, parent_step=parent_step)
    # A run's first delivery has no decisions and no steps yet: nothing to look up for its first plan.
    first = parent_step is None and not getattr(run, "resumed", True)
    valid = None if first else decisions.filter(valid=True).first()
    if valid is not None:
        return valid
    task = run.task
    rules = known_rules(run)
    # The workers as of the claim's stamp (a first delivery's claim reads it), else read now.
    workers, withheld = _offerable_workers(task, rules, list(known_workers(run).values()))
    remaining = task.max_steps - (0 if first else _steps_used(run))
    if remaining <= 0:
        raise RunStopped(
            f"step budget of {task.max_steps} reached before planning", stop_reason=StopReason.STEP_BUDGET
        )
    parent_context: dict[str, Any] = {}
    if parent_step is not None:
        parent_context = {
            "parent_plan": parent_step.decision.plan,
            "last_response": last_response_before(parent_step),
            "visible_responses": tuple(s.response for s in visible_steps(parent_step)),
        }
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
            proposal = _propose(run, conductor, request)
            proposal.latency_ms += load_ms  # a conductor built for this plan: the run waited for it
            load_ms = 0
        plan: Plan | None = None
        error = ""
        try:
            # Withheld workers parse, so that a plan naming one is recorded as blocked by its rule.
            plan = parse_plan(
                proposal.raw_output,
                allowed_workers=set(request.allowed_slugs) | set(withheld),
                max_steps=request.max_steps,
                allow_empty=parent_step is not None,
            )
        except PlanError as exc:
            error = str(exc)
        decision = _record_decision(
            run,
            parent_step=parent_step,
            depth=depth,
            attempt=tries,
            proposal=proposal,
            parsed=plan,
            error=error,
            request=request,
            workers=workers,
            withheld=withheld,
        )
        if decision.valid:
            return decision
        feedback = decision.error
        last_blocked = decision.blocked_by
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


def _propose(run: Run, conductor: Conductor, request: PlanRequest) -> Proposal:
    """Ask the conductor, retrying timeouts, 429 and 5xx like any provider call; each failure is audited."""
    made = 0
    while True:
        claim_current(run)
        try:
            return conductor.propose(request)
        except ConductorUnavailable as exc:
            raise RunStopped(str(exc), stop_reason=StopReason.CONDUCTOR_UNAVAILABLE) from exc
        except ProviderCallError as exc:
            made += 1
            with transaction.atomic():
                record_event(
                    run,
                    Action.CONDUCTOR_CALL_FAILED,
                    run,
                    {
                        "attempt": made,
                        "status": exc.status,
                        "http_status": exc.http_status,
                        "error": str(exc),
                    },
                )
            if not exc.retryable or made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS:
                raise RunStopped(
                    f"the conductor could not be reached after {made} attempt(s): {exc}",
                    stop_reason=StopReason.CONDUCTOR_UNAVAILABLE,
                ) from exc
            time.sleep(backoff(made, exc.retry_after))


def _checked(
    plan: Plan | None,
    *,
    request: PlanRequest,
    workers: list[Worker],
    withheld: dict[str, policies.Verdict],
    classification: str,
    rules: list[policies.PolicyRule],
) -> tuple[dict[str, Any], policies.Verdict | None]:
    """A parsed plan's policy checks, step by step, under `rules` (those of the statement that records
    it: the rules as they are when the plan arrives, not as they were when the conductor was asked),
    and the first verdict that blocks it."""
    checks: dict[str, Any] = {"withheld": {slug: v.as_dict() for slug, v in withheld.items()}, "steps": []}
    blocked: policies.Verdict | None = None
    for i, step in enumerate(plan.steps if plan is not None else []):
        verdict = withheld.get(step.worker)
        if verdict is None and step.worker in request.allowed_slugs and step.worker != CONDUCTOR_SLUG:
            verdict = policies.judge(next(w for w in workers if w.slug == step.worker), classification, rules)
        checks["steps"].append(
            {
                "index": i,
                **(
                    verdict.as_dict()
                    if verdict
                    else {
                        "worker": step.worker,
                        "allowed": True,
                        "rule": "",
                        "reason": "the conductor itself",
                    }
                ),
            }
        )
        if blocked is None and verdict is not None and not verdict.allowed:
            blocked = verdict
    return checks, blocked


def _record_decision(
    run: Run,
    *,
    parent_step: Step | None,
    depth: int,
    attempt: int,
    proposal: Proposal,
    parsed: Plan | None,
    error: str,
    request: PlanRequest,
    workers: list[Worker],
    withheld: dict[str, policies.Verdict],
) -> Decision:
    """The conductor's answer, checked against the policy rules and recorded with its steps and its
    event, in one statement (engine.record.write_once: on the rules' stamp the statement checks)."""
    version = run.conductor_version
    # A plan given with the run (a trainer's sample) is recorded as such, not as the version's own.
    backend = "given" if run.plan_override and parent_step is None else version.backend
    by_slug = {w.slug: w for w in workers}
    # Drawn first: the plan's event names the decision, its steps point to it, and the first steps'
    # attempts and events (started in the same statement) name theirs.
    steps_wanted = len(parsed.steps) if parsed is not None else 0
    ahead = getattr(run, "ids_ahead", None)  # a first delivery's, drawn with its claim: used once
    run.ids_ahead = None  # type: ignore[attr-defined]
    if ahead is not None and parent_step is None and steps_wanted <= len(ahead[1]):
        decision_id, step_ids = ahead[0], ahead[1][:steps_wanted]
    else:
        (decision_id,), step_ids = next_ids(Decision, (Step, steps_wanted))
    recorded: list[Decision] = []

    def stage(fenced: Fence, writes: Writes) -> None:
        checks, blocked = _checked(
            parsed,
            request=request,
            workers=workers,
            withheld=withheld,
            classification=run.task.classification,
            rules=policies.rules_as_of(fenced.rules_stamp),
        )
        plan, why = parsed, error
        if blocked is not None:
            plan = None
            index = next(
                c["index"] for c in checks["steps"] if c["rule"] == blocked.rule and not c["allowed"]
            )
            why = f"blocked by policy '{blocked.rule}': step {index} ({blocked.worker}): {blocked.reason}"
        blocked_by = blocked.rule if blocked else ""
        decision = Decision(
            pk=decision_id,
            run=run,
            parent_step=parent_step,
            depth=depth,
            attempt=attempt,
            backend=backend,
            version_name=version.name,
            prompt=proposal.prompt,
            raw_output=proposal.raw_output,
            plan=plan.as_dict() if plan is not None else None,
            valid=plan is not None,
            error=why,
            alternatives=proposal.alternatives,
            policy_checks=checks,
            blocked_by=blocked_by,
            input_tokens=proposal.input_tokens,
            output_tokens=proposal.output_tokens,
            cost_usd=proposal.cost_usd,
            latency_ms=proposal.latency_ms,
        )
        steps = [
            Step(
                pk=step_ids[i],
                run=run,
                decision=decision,
                index=i,
                depth=depth,
                worker=by_slug.get(s.worker),
                worker_slug=s.worker,
                vendor=by_slug[s.worker].vendor if s.worker in by_slug else "",
                instruction=s.instruction,
                access=s.access,
            )
            for i, s in enumerate(plan.steps if plan is not None else [])
        ]
        writes.insert(decision)
        for step in steps:
            writes.insert(step)
        writes.event(
            Action.PLAN_EMITTED
            if plan is not None
            else (Action.PLAN_BLOCKED if blocked_by else Action.PLAN_REJECTED),
            decision,
            {
                "backend": backend,
                "version": version.name,
                "depth": depth,
                "attempt": attempt,
                "parent_step_id": parent_step.pk if parent_step else None,
                "raw_output": proposal.raw_output,
                "plan": plan.as_dict() if plan is not None else None,
                "error": why,
                "alternatives": proposal.alternatives,
                "policy_checks": checks,
                "blocked_by": blocked_by,
            },
        )
        decision.planned_steps = steps  # type: ignore[attr-defined]  # execute_plan's, as recorded
        # The steps that see no other start with the plan: their calls, for execute_plan to send.
        decision.begun = begin_with_plan(run, steps, fenced, writes) if plan is not None else {}  # type: ignore[attr-defined]
        recorded[:] = [decision]

    write_once(
        run,
        stage,
        cost=proposal.cost_usd,
        input_tokens=proposal.input_tokens,
        output_tokens=proposal.output_tokens,
    )
    return recorded[0]
