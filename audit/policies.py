"""Policies: which workers may receive a task's data. Checked before any call, recorded with the rule.

Two layers: a worker's own clearance (the data classes it may receive, set on the worker) and the
policy rules (data class to self-hosted only, vendor opted out, allowed regions).

A rule's vendors, regions and data classes are compared lower-case and stripped, and must be known:
a rule naming a vendor no worker has (a typo, "Google" for "google") would block nothing. What is
known comes from the app that owns the workers, registered here with `vocabulary_register` (audit
sits below routing and does not import it): routing registers its workers' vendors and regions and
its data classes when it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import transaction

from . import rows
from .models import PolicyRule
from .services import event_record

CLEARANCE_RULE = "worker-clearance"


# --- what a rule may name --------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """Where the known values come from: each a callable, read at every check (workers change)."""

    vendors: Callable[[], Iterable[str]]
    regions: Callable[[], Iterable[str]]
    data_classes: Callable[[], Iterable[str]]


_vocabulary: Vocabulary | None = None


def vocabulary_register(
    *,
    vendors: Callable[[], Iterable[str]],
    regions: Callable[[], Iterable[str]],
    data_classes: Callable[[], Iterable[str]],
) -> None:
    """Called by the app that owns the workers (routing, in its AppConfig.ready)."""
    global _vocabulary
    _vocabulary = Vocabulary(vendors=vendors, regions=regions, data_classes=data_classes)


def _registered() -> Vocabulary:
    if _vocabulary is None:
        raise ImproperlyConfigured("no policy vocabulary registered: routing registers it when it starts")
    return _vocabulary


def normalise(value: str) -> str:
    return value.strip().lower()


def normalise_all(values: Iterable[str]) -> list[str]:
    """Lower-case, stripped, blanks dropped, each once (in the order given)."""
    return list(dict.fromkeys(v for v in (normalise(value) for value in values) if v))


def data_classes() -> list[str]:
    """The data classes tasks carry (from the app that owns tasks)."""
    return normalise_all(_registered().data_classes())


def known_values() -> dict[str, list[str]]:
    """The values a rule may name, per field: vendors and regions of the registered workers, data classes."""
    vocabulary = _registered()
    return {
        "vendors": sorted(set(normalise_all(vocabulary.vendors()))),
        "regions": sorted(set(normalise_all(vocabulary.regions()))),
        "data_classes": data_classes(),
    }


def listed(field: str, known: dict[str, list[str]]) -> str:
    """The known values of a rule's field, as forms and errors list them; where there are none, why."""
    if known[field]:
        return ", ".join(known[field])
    if field == "data_classes" or not _registered().vendors():
        return "none (no worker is registered yet)"
    return f"none (no registered worker declares a {FIELD_WORDS[field][0]})"


FIELD_WORDS = {
    "vendors": ("vendor", "vendors", "the vendors of the registered workers"),
    "regions": ("region", "regions", "the regions of the registered workers"),
    "data_classes": ("data class", "data classes", "the data classes"),
}
# The field each kind of rule needs: without it the rule would match nothing (a vendor block with no
# vendor) or everything (an allowed-regions rule with no region).
REQUIRED = {
    PolicyRule.Kind.VENDOR_BLOCKED: "vendors",
    PolicyRule.Kind.REGION_ALLOWED: "regions",
}
# Fields a kind of rule does not read: a value there would be ignored, silently.
UNUSED = {
    PolicyRule.Kind.SELF_HOSTED_ONLY: ("vendors", "regions"),
    PolicyRule.Kind.VENDOR_BLOCKED: ("regions",),
    PolicyRule.Kind.REGION_ALLOWED: ("vendors",),
}


def rule_values_check(
    *, kind: str, vendors: Iterable[str], regions: Iterable[str], data_classes: Iterable[str]
) -> dict[str, list[str]]:
    """A rule's values, normalised, or ValidationError naming each refused field and the known values.

    The one check of a rule's values: PolicyRule.clean() runs it, so the admin's form and
    `policy_rule_save` both go through it.
    """
    given = {
        "vendors": normalise_all(vendors),
        "regions": normalise_all(regions),
        "data_classes": normalise_all(data_classes),
    }
    known = known_values()
    errors: dict[str, list[str]] = {}
    for field, values in given.items():
        one, many, source = FIELD_WORDS[field]
        if values and field in UNUSED.get(kind, ()):
            errors[field] = [f"a {kind} rule does not use {many}: leave this empty"]
            continue
        unknown = [v for v in values if v not in known[field]]
        if unknown:
            errors[field] = [
                f"unknown {one if len(unknown) == 1 else many}: {', '.join(unknown)}; "
                f"known ({source}): {listed(field, known)}"
            ]
    required = REQUIRED.get(kind)
    if required and not given[required] and required not in errors:
        one, many, source = FIELD_WORDS[required]
        errors[required] = [
            f"a {kind} rule needs at least one {one}; known ({source}): {listed(required, known)}"
        ]
    if errors:
        raise ValidationError(errors)
    return given


def policy_rule_save(*, rule: PolicyRule, actor: Any, via: str) -> PolicyRule:
    """Check and store a rule (new or changed), with its audit event, in one transaction."""
    rule.full_clean()
    created = rule.pk is None
    with transaction.atomic():
        rule.save()
        event_record(
            actor=actor,
            action=f"policyrule.{'registered' if created else 'updated'}",
            obj=rule,
            payload={
                "via": via,
                "name": rule.name,
                "kind": rule.kind,
                "vendors": rule.vendors,
                "regions": rule.regions,
                "data_classes": rule.data_classes,
                "enabled": rule.enabled,
            },
        )
    return rule


def withheld_by_rule(checks: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The workers a plan's policy checks (Decision.policy_checks) withheld from the conductor, by the
    rule that withheld them: [{"rule", "vendors", "workers"}], rules in name order."""
    by_rule: dict[str, dict[str, list[str]]] = {}
    for slug, verdict in ((checks or {}).get("withheld") or {}).items():
        entry = by_rule.setdefault(verdict.get("rule") or "?", {"vendors": [], "workers": []})
        if verdict.get("vendor") and verdict["vendor"] not in entry["vendors"]:
            entry["vendors"].append(verdict["vendor"])
        entry["workers"].append(slug)
    return [
        {"rule": rule, "vendors": sorted(entry["vendors"]), "workers": sorted(entry["workers"])}
        for rule, entry in sorted(by_rule.items())
    ]


# --- judging -----------------------------------------------------------------------------------------


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
    return not rule.data_classes or normalise(classification) in normalise_all(rule.data_classes)


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
        if rule.kind == PolicyRule.Kind.VENDOR_BLOCKED and normalise(worker.vendor) in normalise_all(
            rule.vendors
        ):
            return Verdict(
                worker.slug,
                worker.vendor,
                False,
                rule.name,
                f"vendor {worker.vendor} may not receive {classification} data",
            )
        if rule.kind == PolicyRule.Kind.REGION_ALLOWED and normalise(worker.region) not in normalise_all(
            rule.regions
        ):
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


# The rules table's version (moved by a trigger with every change to it), as it is now: a caller puts it in a statement it makes anyway (the
# engine: its fence before each call) and gets the rules through `rules_as_of`, read again only when
# they changed, however they changed (the admin, the API, SQL).
RULES_STAMP_SQL = rows.table_stamp_sql(PolicyRule)
_rules = rows.Stamped(PolicyRule, RULES_STAMP_SQL, where="t.enabled", order_by="t.name")


def rules_as_of(stamp: str) -> list[PolicyRule]:
    """The enabled rules, given their stamp (RULES_STAMP_SQL) read just before; read from the database
    only when the stamp is not the one of the rules this process last read."""
    return _rules.as_of(stamp)


def screen(
    workers: list[Any], classification: str, rules: list[PolicyRule] | None = None
) -> tuple[list[Any], dict[str, Verdict]]:
    """Split workers into those the conductor may name and those withheld, with the verdict for each
    (under `rules`, or the active rules read now)."""
    rules = active_rules() if rules is None else rules
    allowed, withheld = [], {}
    for worker in workers:
        verdict = judge(worker, classification, rules)
        if verdict.allowed:
            allowed.append(worker)
        else:
            withheld[worker.slug] = verdict
    return allowed, withheld
