"""The static conductor: hand-written routing rules (a workflow per kind of task), no model."""

from __future__ import annotations

import json
import time
from typing import Any

from .base import PlanRequest, Proposal, elapsed_ms

DEFAULT_STATIC_RULES: dict[str, Any] = {
    # Rules are tried in order; the first whose workers are all allowed and whose condition holds wins.
    # "{task}" in an instruction is replaced by the task text.
    "rules": [
        {
            "name": "hard-math-cross-check",
            "when": {"domain": ["math-l5"]},
            "steps": [
                {"worker": "gpt-4o-mini-2024-07-18", "instruction": "{task}", "access": []},
                {"worker": "gemini-1.5-flash", "instruction": "{task}", "access": []},
                {
                    "worker": "gpt-4o-2024-08-06",
                    "instruction": "Two solvers answered the problem below. Check their work and give the correct "
                    "final answer.\n\n{task}",
                    "access": "all",
                },
            ],
        },
        {
            "name": "code-reasoning",
            "when": {"domain": ["cruxeval-o"]},
            "steps": [{"worker": "gpt-4o-2024-08-06", "instruction": "{task}", "access": []}],
        },
        {
            "name": "default-cheap",
            "when": {},
            "steps": [{"worker": "gpt-4o-mini-2024-07-18", "instruction": "{task}", "access": []}],
        },
    ]
}


class StaticConductor:
    """Hand-written rules: the baseline every learned conductor is compared with."""

    def __init__(self, config: dict[str, Any]):
        self.rules = config.get("rules") or DEFAULT_STATIC_RULES["rules"]

    def _matches(self, rule: dict[str, Any], request: PlanRequest) -> bool:
        when = rule.get("when") or {}
        if "domain" in when and request.domain not in when["domain"]:
            return False
        if "min_chars" in when and len(request.task_text) < when["min_chars"]:
            return False
        allowed = set(request.allowed_slugs)
        return (
            all(step["worker"] in allowed for step in rule["steps"])
            and len(rule["steps"]) <= request.max_steps
        )

    def propose(self, request: PlanRequest) -> Proposal:
        started = time.monotonic()
        if request.is_inner:
            plan: dict[str, Any] = {
                "thought": "static rules never expand a step; pass the response through",
                "steps": [],
            }
        else:
            rule = next((r for r in self.rules if self._matches(r, request)), None)
            if rule is None:
                cheapest = min(
                    request.workers, key=lambda w: w.input_usd_per_mtok + w.output_usd_per_mtok, default=None
                )
                steps = (
                    []
                    if cheapest is None
                    else [{"worker": cheapest.slug, "instruction": "{task}", "access": []}]
                )
                plan = {
                    "thought": "no rule matched the allowed pool; cheapest allowed worker",
                    "steps": steps,
                }
            else:
                plan = {"thought": f"rule {rule['name']}", "steps": rule["steps"]}
            plan["steps"] = [
                {**s, "instruction": s["instruction"].replace("{task}", request.task_text)}
                for s in plan["steps"]
            ]
        return Proposal(raw_output=json.dumps(plan), latency_ms=elapsed_ms(started))
