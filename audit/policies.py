"""Policies: which workers may receive a task's data. Checked before any call, recorded with the rule.

Two layers: a worker's own clearance (the data classes it may receive, set on the worker) and the
policy rules (data class to self-hosted only, vendor opted out, allowed regions).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .models import PolicyRule

CLEARANCE_RULE = "worker-clearance"


@dataclass(frozen=True)
class Verdict:
    worker: str
    vendor: str
    allowed: bool
    rule: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _applies(rule: PolicyRule, classification: str) -> bool:
    return not rule.data_classes or classification in rule.data_classes


def judge(worker: Any, classification: str, rules: list[PolicyRule]) -> Verdict:
    """The first rule that blocks this worker for this data class, or an allow naming the rules checked."""
    if classification not in worker.data_classes:
        return Verdict(
            worker.slug,
            worker.vendor,
            False,
            CLEARANCE_RULE,
            f"{worker.slug} is not cleared for {classification} data (cleared: {', '.join(worker.data_classes)})",
        )
    for rule in rules:
        if not rule.enabled or not _applies(rule, classification):
            continue
        if rule.kind == PolicyRule.Kind.SELF_HOSTED_ONLY and not worker.self_hosted:
            return Verdict(
                worker.slug,
                worker.vendor,
                False,
                rule.name,
                f"{classification} data goes to self-hosted workers only; {worker.slug} is hosted by {worker.vendor}",
            )
        if rule.kind == PolicyRule.Kind.VENDOR_BLOCKED and worker.vendor in rule.vendors:
            return Verdict(
                worker.slug,
                worker.vendor,
                False,
                rule.name,
                f"vendor {worker.vendor} may not receive {classification} data",
            )
        if rule.kind == PolicyRule.Kind.REGION_ALLOWED and worker.region not in rule.regions:
            return Verdict(
                worker.slug,
                worker.vendor,
                False,
                rule.name,
                f"{classification} data stays in {', '.join(rule.regions)}; {worker.slug} is in {worker.region or 'an unknown region'}",
            )
    checked = [r.name for r in rules if r.enabled and _applies(r, classification)]
    return Verdict(worker.slug, worker.vendor, True, ", ".join([CLEARANCE_RULE, *checked]), "allowed")


def active_rules() -> list[PolicyRule]:
    return list(PolicyRule.objects.filter(enabled=True).order_by("name"))


def screen(workers: list[Any], classification: str) -> tuple[list[Any], dict[str, Verdict]]:
    """Split workers into those the conductor may name and those withheld, with the verdict for each."""
    rules = active_rules()
    allowed, withheld = [], {}
    for worker in workers:
        verdict = judge(worker, classification, rules)
        if verdict.allowed:
            allowed.append(worker)
        else:
            withheld[worker.slug] = verdict
    return allowed, withheld
