"""One run's proof: its chain, its seal, the checkpoint that covers it (read through indexes, in
milliseconds whatever the size of the record). What a dossier shows.
"""

from __future__ import annotations

from collections.abc import Iterator

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..checkpoints import checkpoint_row, file_matches_row
from ..models import AuditEvent, ChainPurge, Checkpoint, CheckpointHead
from .chains import _Seal, _seal_of, _seal_problems, _unrecorded_purges, _unsigned, _Walk
from .pending import run_end_problems
from .report import Problem, Report, hash_short


def _verify_runs(chains: list[str], *, key: Ed25519PublicKey, use_checkpoint: bool) -> Report:
    """One run's proof (or a few): its chain, its seal, the checkpoint that covers it."""
    report = Report(anchor="checkpoint rows, each checked against its file")
    purges = {p.chain: p for p in ChainPurge.objects.filter(chain__in=chains)}
    sealed: set[str] = set()
    latest = Checkpoint.objects.only("pk", "created_at").order_by("-id").first() if use_checkpoint else None
    for name in chains:
        events = list(AuditEvent.objects.filter(chain=name).order_by("seq"))
        walk = _Walk(name)
        for event in events:
            problem = walk.feed(event)
            if problem is not None:
                report.problems.append(problem)
        if events:
            report.chains += 1
            report.events += len(events)
            report.last_event_id = max(report.last_event_id, max(e.pk for e in events))
        seal = _seal_of(name)
        if seal is not None:
            sealed.add(name)
            added = next((e.pk for e in events if e.seq == seal.seq + 1), None)
            report.problems.extend(_seal_problems(name, seal, walk.tail, purges.get(name), key, added))
        if name not in purges:
            report.problems.extend(run_end_problems(name, events, seal.event_id if seal else None))
        if use_checkpoint and name not in purges:
            report.problems.extend(_covering_problems(report, name, events, seal, latest, key))
    report.problems.extend(_unrecorded_purges(purges, sealed, chains))
    return report


def _covering_problems(
    report: Report,
    name: str,
    events: list[AuditEvent],
    seal: _Seal | None,
    latest: Checkpoint | None,
    key: Ed25519PublicKey,
) -> Iterator[Problem]:
    row = CheckpointHead.objects.filter(chain=name).select_related("checkpoint").order_by("-seq").first()
    signed_seq = 0
    if row is not None:
        checkpoint = row.checkpoint
        label = f"checkpoint {checkpoint.number or checkpoint.pk}"
        report.checkpoint_id, report.checkpoint_number = checkpoint.pk, checkpoint.number
        report.checkpoint_at = checkpoint.created_at.isoformat()
        report.checkpoints_checked += 1
        if not checkpoint_row(checkpoint, key=key).signature_ok:
            yield Problem("checkpoint", None, name, row.seq, f"{label}: its signature does not hold")
            return
        why = file_matches_row(checkpoint)
        if why is not None:
            yield Problem("checkpoint", None, name, row.seq, why)
        signed = checkpoint.body.get("heads", {}).get(name)
        if signed is None:
            yield Problem(
                "checkpoint", None, name, row.seq, f"{label} does not sign this chain (index row forged)"
            )
            return
        signed_seq, signed_hash = signed
        event = next((e for e in events if e.seq == signed_seq), None)
        if event is None:
            yield Problem(
                "missing",
                None,
                name,
                signed_seq,
                f"{label} signed seq {signed_seq} of this chain; that event is gone",
                expected=f"seq {signed_seq} with hash {hash_short(signed_hash)}",
                near_id=events[-1].pk if events else None,
            )
        elif event.hash != signed_hash:
            yield Problem(
                "checkpoint",
                event.pk,
                name,
                signed_seq,
                f"{label}: event #{event.pk} ({name} seq {signed_seq}) differs from the signed head",
                expected=f"hash {hash_short(signed_hash)}, found {hash_short(event.hash)}",
            )
    if seal is not None and latest is not None:
        yield from _unsigned(name, seal, signed_seq, latest.created_at)
