"""The learned conductor: the GRPO-trained policy as a conductor backend. Registered with routing's
backends by the training app (apps.py), so that routing, below training, never imports it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from routing.conductors import PlanRequest, Proposal, elapsed_ms
from routing.models import CONDUCTOR_SLUG
from routing.scoring.scorers import extract_answer

from .policy import Policy, agree, parse_instruction, tie_instruction


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
        alternatives = [
            {"workflow": self.policy.actions[i].name, "p": round(float(p[i]), 4)} for i in order[:5]
        ]
        fitting = [i for i in order if _fits(self.policy.actions[i], request, allowed)]
        temperature = getattr(request, "temperature", None)
        chosen = None
        if fitting and temperature is not None and temperature > 0:
            import numpy as np

            x = self.policy.featurize(request.task_text, request.domain)
            q = self.policy.probabilities(x, temperature)[fitting]
            rng = np.random.default_rng(getattr(request, "seed", None))
            chosen = self.policy.actions[fitting[int(rng.choice(len(fitting), p=q / q.sum()))]]
        elif fitting:
            chosen = self.policy.actions[fitting[0]]
        if chosen is None and request.workers:
            # None of the policy's workflows can be offered (free text: the replay pool cannot answer
            # it): the cheapest worker that can, as the static rules do.
            cheapest = min(request.workers, key=lambda w: w.input_usd_per_mtok + w.output_usd_per_mtok)
            plan = {
                "thought": f"no workflow of the policy fits the workers that can answer; the cheapest, {cheapest.slug}",
                "steps": [{"worker": cheapest.slug, "instruction": request.task_text, "access": []}],
            }
        elif chosen is None:
            plan = {"thought": "no workflow of the policy fits the allowed workers", "steps": []}
        else:
            named = chosen.__class__(chosen.kind, tuple(allowed[w.lower()] for w in chosen.workers))
            plan = named.plan(request.task_text)  # workers, judges included, as the pool names them
            index = self.policy.actions.index(chosen)
            sampled = ", sampled" if temperature is not None and temperature > 0 else ""
            plan["thought"] += (
                f" (the policy's probability for this workflow: {float(p[index]):.2f}{sampled})"
            )
            kind = self.policy.kind(request.domain)
            if not sampled and self.policy.fallback.get(kind) == index:
                plan["thought"] += (
                    f"; the best fixed workflow for kind {kind}: the learned choice did not beat it"
                )
        return Proposal(
            raw_output=json.dumps(plan),
            # What the policy weighed, where it chose among them: none of its workflows was open to a
            # plan made without it, and a dossier must not show them as if they had been.
            alternatives=[{"step": 0, "candidates": alternatives}] if chosen is not None else [],
            latency_ms=elapsed_ms(started),
        )


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
