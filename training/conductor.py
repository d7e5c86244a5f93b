"""The learned conductor: the GRPO-trained policy as a conductor backend. Registered with routing's
backends by the training app (apps.py), so that routing, below training, never imports it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from routing.conductors import PlanRequest, Proposal, elapsed_ms
from routing.models import CONDUCTOR_SLUG
from routing.scoring.scorers import extract_answer

from .policy import Policy, Workflow, agree, parse_instruction, tie_instruction


class LearnedConductor:
    """The GRPO-trained policy (training.policy): picks a workflow in milliseconds on a CPU.

    Greedy by default; when the request carries a temperature > 0 (a trainer's rollout), the workflow is
    sampled from the policy at that temperature, seeded by the request, among the workflows that fit.

    The conductor step of a cascade or a vote comes back here as an inner call and reads what to do from
    its own instruction (policy.parse_instruction):
    - cascade: pass the answer through when the two cheap answers agree, else ask the judge;
    - vote: the same, but on disagreement plan [tie-breaker, conductor]; that inner conductor step (one
      level deeper) passes the tie-breaker's answer through when it agrees with one of the two earlier
      answers (they are written into its instruction), else asks the judge. Where the step or depth
      budget leaves no room for that, the judge is asked at once.
    """

    def __init__(self, config: dict[str, Any]):
        path = config.get("policy_path")
        if not path:
            raise ValueError("a learned conductor needs config['policy_path']")
        self.policy = Policy.from_json(Path(path).read_text())

    def propose(self, request: PlanRequest) -> Proposal:
        started = time.monotonic()
        if request.is_inner:
            plan = _learned_inner_plan(request, self.policy.scorer(request.domain))
            return Proposal(raw_output=json.dumps(plan), latency_ms=elapsed_ms(started))
        allowed = {slug.lower(): slug for slug in request.allowed_slugs}
        # The task's kind is its domain label; one the policy never saw is planned from the text alone,
        # and a kind it falls back on for puts that kind's fixed workflow first (Policy.ranked).
        order, p = self.policy.ranked(request.task_text, request.domain)
        # Only the workflows open to this task (its workers allowed, its budgets) are weighed: what a
        # policy rule withholds is neither chosen nor shown as weighed.
        fitting = [i for i in order if _fits(self.policy.actions[i], request, allowed)]
        temperature: float = getattr(request, "temperature", None) or 0.0
        sampled = bool(fitting) and temperature > 0
        if sampled:
            x = self.policy.featurize(request.task_text, request.domain)
            weights = self.policy.probabilities(x, temperature)[fitting]
        else:
            weights = p[fitting]
        among = weights / weights.sum() if fitting else weights  # each one's probability among them
        chosen = None
        if sampled:
            rng = np.random.default_rng(getattr(request, "seed", None))
            chosen = fitting[int(rng.choice(len(fitting), p=among))]
        elif fitting:
            chosen = fitting[0]
        if chosen is None:
            return Proposal(
                raw_output=json.dumps(_plan_without_the_policy(request)),
                # None of its workflows was open: a dossier must not show them as if they had been.
                alternatives=[],
                latency_ms=elapsed_ms(started),
            )
        named = {i: _as_pool_names(self.policy.actions[i], allowed) for i in fitting}
        plan = named[chosen].plan(request.task_text)  # workers, judges included, as the pool names them
        kind = self.policy.kind(request.domain)
        gated = not sampled and self.policy.fallback.get(kind) == chosen
        position = fitting.index(chosen)
        if sampled:
            plan["thought"] += (
                f" (sampled at temperature {temperature:g}; its probability among the {len(fitting)} "
                f"workflows open to this task: {among[position]:.2f})"
            )
        elif gated:
            learned = max(range(len(fitting)), key=lambda n: among[n])
            plan["thought"] += f"; the best fixed workflow for kind {kind}"
            if fitting[learned] != chosen:  # the policy would have chosen another: say which, and why not
                plan["thought"] += (
                    f": the policy's own first choice, {named[fitting[learned]].name} ({among[learned]:.2f}), "
                    "did not beat it in cross-validation"
                )
        else:
            plan["thought"] += (
                f" (the policy's probability for this workflow among the {len(fitting)} open to this "
                f"task: {among[position]:.2f})"
            )
        candidates: list[dict[str, Any]] = [
            {"workflow": named[i].name, "p": round(float(among[n]), 4)}
            | ({"chosen": True} if i == chosen else {})
            | ({"fixed": True} if gated and i == chosen else {})
            for n, i in enumerate(fitting)
        ]
        shown = sorted(candidates, key=lambda c: (not c.get("chosen"), -c["p"]))[:5]
        return Proposal(
            raw_output=json.dumps(plan),
            alternatives=[{"step": 0, "candidates": shown}],
            latency_ms=elapsed_ms(started),
        )


def _as_pool_names(workflow: Workflow, allowed: dict[str, str]) -> Workflow:
    """The workflow with its workers named as the pool names them (the policy keeps lower case)."""
    return Workflow(workflow.kind, tuple(allowed[w.lower()] for w in workflow.workers))


def _plan_without_the_policy(request: PlanRequest) -> dict[str, Any]:
    """No workflow of the policy fits: free text the replay pool cannot answer goes to the cheapest
    worker that can, as the static rules do; with no worker at all, an empty plan."""
    if not request.workers:
        return {"thought": "no workflow of the policy fits the allowed workers", "steps": []}
    cheapest = min(request.workers, key=lambda w: w.input_usd_per_mtok + w.output_usd_per_mtok)
    return {
        "thought": f"no workflow of the policy fits the workers that can answer; the cheapest, {cheapest.slug}",
        "steps": [{"worker": cheapest.slug, "instruction": request.task_text, "access": []}],
    }


def _fits(workflow, request: PlanRequest, allowed: dict[str, str]) -> bool:
    return (
        all(w.lower() in allowed for w in workflow.workers)
        and len(workflow.plan("")["steps"]) <= request.max_steps
        and (request.may_recurse or not workflow.needs_recursion)
    )


def _learned_inner_plan(request: PlanRequest, scorer: str | None) -> dict[str, Any]:
    """The conductor step of a learned cascade or vote (see LearnedConductor); answers agree by the
    kind's scorer (`scorer`, else the default for the domain)."""

    instructions = [
        st.get("instruction", "")
        for st in (request.parent_plan or {}).get("steps", [])
        if st.get("worker") == CONDUCTOR_SLUG
    ]
    asked = parse_instruction(instructions[0]) if instructions else {"kind": "unknown"}
    answers = [extract_answer(r) for r in request.visible_responses]
    allowed = {slug.lower(): slug for slug in request.allowed_slugs}
    passed = {"thought": "the answers agree: pass through", "steps": []}
    if asked["kind"] == "unknown":
        return {"thought": "no instruction this conductor understands: pass through", "steps": []}
    if asked["kind"] == "tie":
        last = answers[-1] if answers else ""
        if any(agree(last, earlier, request.domain, scorer) for earlier in asked["earlier"]):
            return {"thought": "the tie-breaker sides with an earlier answer: pass it through", "steps": []}
    elif answers and all(
        agree(answers[0], other, request.domain, scorer) for other in answers[1:] or answers
    ):
        return passed
    judge = allowed.get(asked["judge"].lower())
    tie = allowed.get(asked.get("tie_breaker", "").lower()) if asked["kind"] == "vote" else None
    if tie and tie != CONDUCTOR_SLUG and request.may_recurse and request.max_steps >= 2 and judge:
        return {
            "thought": f"the answers disagree: {tie} breaks the tie",
            "steps": [
                {"worker": tie, "instruction": request.task_text, "access": []},
                {"worker": CONDUCTOR_SLUG, "instruction": tie_instruction(judge, answers), "access": "all"},
            ],
        }
    if judge is None or judge == CONDUCTOR_SLUG:
        return {"thought": "the judge is not available: pass the last answer through", "steps": []}
    return {
        "thought": f"the answers disagree: ask {judge}",
        "steps": [{"worker": judge, "instruction": request.task_text, "access": []}],
    }
