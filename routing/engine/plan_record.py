"""The plan transition: the conductor's answer is checked against the policy rules and recorded, with
its steps and its event, in one write; a valid plan's first steps start in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from audit import policies
from audit.actions import Action

from ..conductors import PlanRequest, Proposal
from ..models import CONDUCTOR_SLUG, Decision, Step, Worker
from ..models.transitions import Change as By
from ..plans import Plan
from .calls import Call
from .changes import Change, Cost, Event, inserted
from .execution import Assumed, RunExecution
from .executor import apply, next_ids
from .step_start import begin_with_plan


@dataclass
class RecordedPlan:
    """A decision as the engine executes it: its steps as recorded with it (their workers with them;
    None for a decision read back, whose steps are read when executed), and the calls of the first
    steps that started with it, by step index."""

    decision: Decision
    steps: list[Step] | None = None
    begun: dict[int, Call] = field(default_factory=dict)


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


@dataclass(frozen=True)
class PlanAnswer:
    """The conductor's answer at one level of a run, as planning parsed it: `parsed` (None when it did
    not parse, `error` saying why), for the `request` it was asked, offered `workers` (and told of
    those the policy rules `withheld`)."""

    parent_step: Step | None
    depth: int
    attempt: int
    proposal: Proposal
    parsed: Plan | None
    error: str
    request: PlanRequest
    workers: list[Worker]
    withheld: dict[str, policies.Verdict]


def record_plan(execution: RunExecution, answer: PlanAnswer) -> RecordedPlan:
    """The conductor's answer, checked against the policy rules and recorded with its steps and its
    event, in one change (`plan_recorded`). A valid plan's first steps (those that see no other)
    start in the same change when they may."""
    ids = _ids(execution, answer)
    return apply(execution, partial(plan_recorded, execution, answer, ids)).result  # type: ignore[no-any-return]


def plan_recorded(
    execution: RunExecution, answer: PlanAnswer, ids: tuple[int, list[int]], assumed: Assumed
) -> Change:
    """The plan recorded: its decision and steps, checked under the rules as of the write's stamp (the
    rules as they are when the plan arrives, not as they were when the conductor was asked), its
    event, the conductor's cost; and its first steps' start (`begin_with_plan`). Its result: the
    RecordedPlan."""
    decision, steps = _rows(execution, answer, ids, policies.rules_as_of(assumed.rules_stamp))
    proposal = answer.proposal
    change = Change(
        by=(By.PLAN_RECORDED,),
        inserts=(decision, *(inserted(step, By.PLAN_RECORDED) for step in steps)),
        events=(Event(_action(decision), decision, _payload(decision)),),
        cost=Cost(proposal.cost_usd, proposal.input_tokens, proposal.output_tokens),
    )
    begun = (
        begin_with_plan(
            execution,
            steps,
            assumed.plus(change.cost.usd, change.cost.input_tokens, change.cost.output_tokens),
        )
        if decision.valid
        else None
    )
    if begun is None:
        return replace(change, result=RecordedPlan(decision, steps, {}))
    return replace(change + begun, result=RecordedPlan(decision, steps, begun.result))


def _ids(execution: RunExecution, answer: PlanAnswer) -> tuple[int, list[int]]:
    """The ids of the decision and its steps, drawn first: the plan's event names the decision, its
    steps point to it, and the first steps' attempts and events (started in the same write) name
    theirs. A first delivery's were drawn with its claim."""
    wanted = len(answer.parsed.steps) if answer.parsed is not None else 0
    ahead = execution.take_first_ids()  # used once, whatever this plan takes
    if ahead is not None and answer.parent_step is None and wanted <= len(ahead.steps):
        return ahead.decision, ahead.steps[:wanted]
    (decision_id,), step_ids = next_ids(Decision, (Step, wanted))
    return decision_id, step_ids


def _rows(
    execution: RunExecution, answer: PlanAnswer, ids: tuple[int, list[int]], rules: list[policies.PolicyRule]
) -> tuple[Decision, list[Step]]:
    """The decision and its steps as recorded under these rules: a plan a rule blocks is recorded as
    blocked, without steps."""
    run = execution.run
    version = run.conductor_version
    # A plan given with the run (a trainer's sample) is recorded as such, not as the version's own.
    backend = "given" if run.plan_override and answer.parent_step is None else version.backend
    checks, blocked = _checked(
        answer.parsed,
        request=answer.request,
        workers=answer.workers,
        withheld=answer.withheld,
        classification=run.task.classification,
        rules=rules,
    )
    plan, why = answer.parsed, answer.error
    if blocked is not None:
        plan = None
        index = next(c["index"] for c in checks["steps"] if c["rule"] == blocked.rule and not c["allowed"])
        why = f"blocked by policy '{blocked.rule}': step {index} ({blocked.worker}): {blocked.reason}"
    proposal = answer.proposal
    decision_id, step_ids = ids
    decision = Decision(
        pk=decision_id,
        run=run,
        parent_step=answer.parent_step,
        depth=answer.depth,
        attempt=answer.attempt,
        backend=backend,
        version_name=version.name,
        prompt=proposal.prompt,
        raw_output=proposal.raw_output,
        plan=plan.as_dict() if plan is not None else None,
        valid=plan is not None,
        error=why,
        alternatives=proposal.alternatives,
        policy_checks=checks,
        blocked_by=blocked.rule if blocked else "",
        input_tokens=proposal.input_tokens,
        output_tokens=proposal.output_tokens,
        cost_usd=proposal.cost_usd,
        latency_ms=proposal.latency_ms,
    )
    by_slug = {w.slug: w for w in answer.workers}
    steps = [
        Step(
            pk=step_ids[i],
            run=run,
            decision=decision,
            index=i,
            depth=answer.depth,
            worker=by_slug.get(s.worker),
            worker_slug=s.worker,
            vendor=by_slug[s.worker].vendor if s.worker in by_slug else "",
            instruction=s.instruction,
            access=s.access,
        )
        for i, s in enumerate(plan.steps if plan is not None else [])
    ]
    return decision, steps


def _action(decision: Decision) -> str:
    if decision.valid:
        return Action.PLAN_EMITTED
    return Action.PLAN_BLOCKED if decision.blocked_by else Action.PLAN_REJECTED


def _payload(decision: Decision) -> dict[str, Any]:
    """The plan's event: what the decision records of the conductor's answer and its checks."""
    return {
        "backend": decision.backend,
        "version": decision.version_name,
        "depth": decision.depth,
        "attempt": decision.attempt,
        "parent_step_id": decision.parent_step_id,
        "raw_output": decision.raw_output,
        "plan": decision.plan,
        "error": decision.error,
        "alternatives": decision.alternatives,
        "policy_checks": decision.policy_checks,
        "blocked_by": decision.blocked_by,
    }
