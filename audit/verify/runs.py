"""One run's proof: its chain, its seal, the checkpoint that covers it (read through indexes, in
milliseconds whatever the size of the record). What a dossier shows.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings

from .. import inclusion, log, merkle
from ..checkpoints import checkpoint_row, file_matches_row
from ..models import AuditEvent, ChainPurge, Checkpoint, CheckpointHead, PendingSeal
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
            row = PendingSeal.objects.filter(chain=name).first()
            if row is not None and row.leaf_index is not None:
                report.problems.extend(_log_problems(report, row, events, key))
            else:  # not in the log yet, or sealed before it: the checkpoints that signed its heads
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
        if not (yield from _checkpoint_problems(report, name, row.seq, checkpoint, key)):
            return
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


def _checkpoint_problems(
    report: Report, name: str, seq: int, checkpoint: Checkpoint, key: Ed25519PublicKey
) -> Generator[Problem, None, bool]:
    """The checkpoint that covers a chain, reported as its proof's anchor: its signature and its file;
    returns whether its signature holds."""
    label = f"checkpoint {checkpoint.number or checkpoint.pk}"
    report.checkpoint_id, report.checkpoint_number = checkpoint.pk, checkpoint.number
    report.checkpoint_at = checkpoint.created_at.isoformat()
    report.checkpoints_checked += 1
    if not checkpoint_row(checkpoint, key=key).signature_ok:
        yield Problem("checkpoint", None, name, seq, f"{label}: its signature does not hold")
        return False
    why = file_matches_row(checkpoint, key=key)
    if why is not None:
        yield Problem("checkpoint", None, name, seq, why)
    return True


def _log_problems(
    report: Report, row: PendingSeal, events: list[AuditEvent], key: Ed25519PublicKey
) -> Iterator[Problem]:
    """A logged run chain: its leaf, rebuilt from the chain's last event, leads by the audit path of
    the stored tree to the root that the latest signed tree head signs."""
    name = row.chain
    head = inclusion.latest_tree_head()
    try:
        proof = inclusion.of_row(row, head=head)
    except log.LogError as exc:
        yield Problem("log", None, name, row.seq, f"its leaf {row.leaf_index} cannot be proven: {exc}")
        return
    if proof is None:  # logged after the latest signed tree head
        grace = timedelta(seconds=2 * settings.AUDIT_SEAL_EVERY_S + 60)
        if head is not None and head.created_at > row.created_at + grace:
            yield Problem(
                "unsigned",
                None,
                name,
                row.seq,
                f"its leaf {row.leaf_index} is in the log, but the latest signed tree head (checkpoint "
                f"{head.number}, {head.body['tree']['size']} leaves) does not cover it",
                expected=f"a signed tree head of more than {row.leaf_index} leaves",
            )
        return
    checkpoint = proof.checkpoint
    label = f"checkpoint {checkpoint.number or checkpoint.pk}"
    report.inclusions[name] = proof.document()
    if not (yield from _checkpoint_problems(report, name, row.seq, checkpoint, key)):
        return
    tail = events[-1] if events else None
    # The leaf of the chain as it ends now (its pending row's run): the one the log must hold.
    leaf = log.leaf_of(row, seq=tail.seq, hash_=tail.hash) if tail is not None else b""
    if not merkle.inclusion_verify(
        proof.leaf_index, proof.tree_size, merkle.leaf_hash(leaf), proof.path, proof.root
    ):
        ends = f"seq {tail.seq} (hash {hash_short(tail.hash)})" if tail is not None else "no event"
        yield Problem(
            "log",
            tail.pk if tail is not None else None,
            name,
            row.seq,
            f"its chain ends at {ends}, but that end is not leaf {proof.leaf_index} of the tree {label} "
            f"signs ({proof.tree_size} leaves): the chain, its seal or the log was changed after it was signed",
            expected=f"the audit path of leaf {proof.leaf_index} to lead to root {hash_short(proof.root.hex())}",
            near_id=tail.pk if tail is not None else None,
        )
