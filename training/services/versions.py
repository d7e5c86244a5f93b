"""Conductor versions: promotion, rollback, shadow mode (an LLM version's adapter loaded first)."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from audit.actions import Action
from audit.models import AuditEvent
from audit.services import Actor, event_record
from routing.models import ConductorVersion
from routing.services import conductor_activate

from ..models import Evaluation
from .adapters import adapter_load
from .common import TrainingError
from .evaluations import Comparison, evaluation_comparison

OVERRIDE_REASON_MAX_CHARS = 500


class PromotionRefused(TrainingError):
    """The promotion gate: the candidate is dominated by the baseline on its evaluation's items."""


def promotion_gate(evaluation: Evaluation, comparison: Comparison | None = None) -> str | None:
    """Why promoting `evaluation`'s candidate is refused (it is dominated by the baseline on the items
    both have finished, on the point estimates), or None. `comparison`: evaluation_comparison's, if
    the caller has it."""
    comparison = comparison or evaluation_comparison(evaluation)
    if not comparison.dominated:
        return None
    a, c = comparison.accuracy, comparison.usd_per_1000
    assert a is not None and c is not None  # dominated says so
    return (
        f"{evaluation.candidate.name} is dominated by {evaluation.baseline.name} on the {len(comparison.pairs)} "
        f"items both ran: accuracy {a.delta:+.3f}, cost {c.delta:+} USD per 1,000 tasks (not more accurate "
        "and not cheaper)"
    )


def _activation_load(version: ConductorVersion, actor: Actor) -> dict[str, Any] | None:
    """Load the adapter of a version about to become active; a refusal is recorded, and nothing changes."""
    try:
        return adapter_load(version)
    except TrainingError as exc:
        with transaction.atomic():
            event_record(
                actor=actor,
                action=Action.CONDUCTOR_PROMOTION_FAILED,
                obj=version,
                payload={"error": str(exc)},
            )
        raise


def conductor_promote(
    *,
    version: ConductorVersion,
    actor: Actor,
    evaluation: Evaluation | None = None,
    override_reason: str = "",
    may_override: bool = False,
) -> ConductorVersion:
    """Make `version` the conductor that plans the next tasks (loading its adapter first, if any).

    `evaluation`: the evaluation of `version` the promotion was decided on; its deltas go into the
    audit event (`evidence`), and the promotion is refused (PromotionRefused, nothing written) when the
    baseline dominates the candidate on its items, unless `override_reason` is given by an actor who
    `may_override` (an admin): the override, its reason and the gate's finding are kept in the event."""
    if version.is_active:
        raise TrainingError(f"{version.name} is already the active conductor")
    evidence = None
    override_reason = override_reason.strip()
    if evaluation is not None:
        if evaluation.candidate_id != version.pk:
            raise TrainingError(f"evaluation #{evaluation.pk} is not of {version.name}")
        comparison = evaluation_comparison(evaluation)
        evidence = {"evaluation": evaluation.pk, **comparison.evidence()}
        refused = promotion_gate(evaluation, comparison)
        if refused and not override_reason:
            raise PromotionRefused(f"{refused}. An admin may override this, with a reason.")
        if refused and not may_override:
            raise PromotionRefused(f"{refused}. Only an admin may override the promotion gate.")
        if len(override_reason) > OVERRIDE_REASON_MAX_CHARS:
            raise TrainingError(f"the override's reason is over {OVERRIDE_REASON_MAX_CHARS} characters")
        if refused:
            evidence["override"] = {"gate": refused, "reason": override_reason, "by": actor.name}
    elif override_reason:
        raise TrainingError("an override needs the evaluation whose gate it overrides")
    loaded = _activation_load(version, actor)
    try:
        return _promote(version, actor, loaded, evidence)
    except IntegrityError as exc:  # another promotion or a shadow change got there first
        raise TrainingError(f"{version.name} changed while being promoted; try again") from exc


def _promote(
    version: ConductorVersion, actor: Actor, loaded: dict[str, Any] | None, evidence: dict[str, Any] | None
) -> ConductorVersion:
    with transaction.atomic():
        previous = ConductorVersion.objects.filter(is_active=True).first()
        _leave_shadow(version, actor)
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_PROMOTED,
            obj=version,
            payload={
                "name": version.name,
                "previous": previous.name if previous else None,
                "adapter": loaded,
                **({"evidence": evidence} if evidence else {}),
            },
        )
        return conductor_activate(version=version, actor=actor)


def rollback_target() -> tuple[ConductorVersion | None, ConductorVersion | None]:
    """The active version and the one a roll back would re-activate: the version that was active
    before it (read from the audit record); None where there is none."""
    current = ConductorVersion.objects.filter(is_active=True).first()
    if current is None:
        return None, None
    last = (
        AuditEvent.objects.filter(
            action=Action.CONDUCTOR_ACTIVATED, object_type="conductorversion", object_id=str(current.pk)
        )
        .order_by("-id")
        .first()
    )
    previous_name = (last.payload or {}).get("previous") if last else None
    previous = ConductorVersion.objects.filter(name=previous_name).first() if previous_name else None
    return current, previous


def conductor_rollback(*, actor: Actor) -> ConductorVersion:
    """Re-activate the version that was active before the current one (rollback_target)."""
    current, previous = rollback_target()
    if current is None:
        raise TrainingError("no conductor is active: nothing to roll back")
    if previous is None:
        raise TrainingError(f"no earlier conductor to roll back to from {current.name}")
    _activation_load(previous, actor)  # vLLM may have restarted since it last served this adapter
    with transaction.atomic():
        _leave_shadow(previous, actor)
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_ROLLED_BACK,
            obj=previous,
            payload={"from": current.name, "to": previous.name},
        )
        return conductor_activate(version=previous, actor=actor)


def _leave_shadow(version: ConductorVersion, actor: Actor) -> None:
    """A version about to become active stops shadowing (recorded: shadow mode really ends)."""
    if ConductorVersion.objects.filter(pk=version.pk, is_shadow=True).update(is_shadow=False):
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_SHADOW_CLEARED,
            obj=version,
            payload={"shadow": None, "previous": version.name, "reason": "activated"},
        )


def shadow_set(*, version: ConductorVersion | None, actor: Actor) -> None:
    """`version` plans every new live task alongside the active one, without affecting it; None: stop."""
    if version is not None and version.is_active:
        raise TrainingError(f"{version.name} is the active conductor; shadow a candidate instead")
    loaded = adapter_load(version) if version is not None else None  # a shadow LLM needs its adapter served
    try:
        _shadow_switch(version, actor, loaded)
    except IntegrityError as exc:  # the version was promoted meanwhile
        raise TrainingError("the conductors changed meanwhile; reload and try again") from exc


def _shadow_switch(version: ConductorVersion | None, actor: Actor, loaded: dict[str, Any] | None) -> None:
    with transaction.atomic():
        previous = ConductorVersion.objects.select_for_update().filter(is_shadow=True).first()
        if version is None and previous is None:
            return  # nothing shadows: nothing to clear
        ConductorVersion.objects.filter(is_shadow=True).update(is_shadow=False)
        if version is not None:
            ConductorVersion.objects.filter(pk=version.pk).update(is_shadow=True)
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_SHADOW_SET if version else Action.CONDUCTOR_SHADOW_CLEARED,
            obj=version or previous,
            payload={
                "shadow": version.name if version else None,
                "previous": previous.name if previous else None,
                "adapter": loaded,
            },
        )
