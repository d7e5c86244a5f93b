"""The static conductor: hand-written routing rules (a workflow per kind of task), no model."""

from __future__ import annotations

import json
import time
from typing import Any

from ..static_rules import DEFAULT_STATIC_RULES
from .base import PlanRequest, Proposal, elapsed_ms

__all__ = ["DEFAULT_STATIC_RULES", "StaticConductor"]


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
