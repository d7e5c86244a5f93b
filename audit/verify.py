"""Verification: recompute every chain and name the first event that does not hold.

Reads events in (chain, seq) order in batches, so it runs in bounded memory on any number of events.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db.models import Q

from . import chain
from .checkpoints import chain_purges, checkpoint_latest, checkpoint_problems
from .models import GLOBAL_CHAIN, AuditEvent

BATCH = 2000  # events per database round trip; a few MB at most


@dataclass(frozen=True)
class Problem:
    kind: str  # altered | missing | reordered | unsealed-tail | checkpoint
    event_id: int | None
    chain: str
    seq: int | None
    detail: str

    def sentence(self) -> str:
        where = f"event #{self.event_id}" if self.event_id else f"chain {self.chain}"
        return f"{self.kind}: {where} ({self.chain}, seq {self.seq}): {self.detail}"


@dataclass
class Report:
    events: int = 0
    chains: int = 0
    last_event_id: int = 0
    problems: list[Problem] = field(default_factory=list)
    checkpoint_id: int | None = None
    checkpoint_at: str | None = None

    @property
    def intact(self) -> bool:
        return not self.problems

    @property
    def first_problem(self) -> Problem | None:
        located = [p for p in self.problems if p.event_id is not None]
        if located:
            return min(located, key=lambda p: p.event_id or 0)
        return self.problems[0] if self.problems else None

    def summary(self) -> str:
        if self.intact:
            proof = (
                f"; checkpoint {self.checkpoint_id} ({self.checkpoint_at}) verifies"
                if self.checkpoint_id
                else ""
            )
            return f"intact up to event {self.last_event_id} ({self.events} events in {self.chains} chains){proof}"
        first = self.first_problem
        assert first is not None
        return f"NOT INTACT: {first.sentence()} ({len(self.problems)} problem(s) in all)"


def _events(chains: list[str] | None) -> Iterator[AuditEvent]:
    qs = AuditEvent.objects.order_by("chain", "seq")
    if chains is not None:
        qs = qs.filter(chain__in=chains)
    return qs.iterator(chunk_size=BATCH)


def verify(*, chains: list[str] | None = None, use_checkpoint: bool = True) -> Report:
    report = Report()
    purges = chain_purges()
    seals: dict[str, tuple[int, str, int]] = {}  # run chain -> (seq, hash, id of the seal event)
    tails: dict[str, tuple[int, str, int]] = {}
    if chains is not None:  # a subset: read the seals of those chains from the global chain
        for seal in AuditEvent.objects.filter(
            chain=GLOBAL_CHAIN, action="run.sealed", payload__chain__in=chains
        ):
            seals[seal.payload["chain"]] = (seal.payload["seq"], seal.payload["hash"], seal.pk)
    current = None
    expected_seq, prev_hash, broken = 1, chain.GENESIS, False
    for event in _events(chains):
        if event.chain != current:
            current = event.chain
            report.chains += 1
            expected_seq, prev_hash, broken = 1, chain.GENESIS, False
        report.events += 1
        report.last_event_id = max(report.last_event_id, event.pk)
        if chains is None and event.chain == GLOBAL_CHAIN and event.action == "run.sealed":
            seals[event.payload["chain"]] = (event.payload["seq"], event.payload["hash"], event.pk)
        if not broken:
            problem = _check(event, expected_seq, prev_hash)
            if problem is not None:
                report.problems.append(problem)
                broken = True  # the rest of this chain cannot be trusted past here; report once
        expected_seq, prev_hash = event.seq + 1, event.hash
        tails[event.chain] = (event.seq, event.hash, event.pk)
    for run_chain, (seq, head_hash, seal_id) in seals.items():
        if run_chain in purges:
            purge = purges[run_chain]
            if (purge.last_seq, purge.last_hash) != (seq, head_hash):
                report.problems.append(
                    Problem("missing", None, run_chain, seq, "purged chain does not match its seal")
                )
            continue
        tail = tails.get(run_chain)
        if tail is None:
            report.problems.append(
                Problem(
                    "missing",
                    None,
                    run_chain,
                    seq,
                    f"all events of this sealed chain are gone (seal #{seal_id})",
                )
            )
        elif (tail[0], tail[1]) != (seq, head_hash):
            report.problems.append(
                Problem(
                    "missing",
                    tail[2],
                    run_chain,
                    tail[0],
                    f"the chain ends at seq {tail[0]} but its seal (#{seal_id}) says {seq}",
                )
            )
    # A ChainPurge row lets the trigger delete a chain's events, and the app's own database user can
    # insert one: a purge counts only when a seal and a task.purged event of the global chain vouch for it.
    recorded = _recorded_purges(chains)
    for purged_chain, purge in purges.items():
        if chains is not None and purged_chain not in chains:
            continue
        if purged_chain not in seals or purged_chain not in recorded:
            report.problems.append(
                Problem(
                    "missing",
                    None,
                    purged_chain,
                    purge.last_seq,
                    "its events were deleted under a purge that the global chain does not record",
                )
            )
    if use_checkpoint:
        checkpoint = checkpoint_latest()
        if checkpoint is not None:
            report.checkpoint_id = checkpoint.pk
            report.checkpoint_at = checkpoint.created_at.isoformat()
            for message in checkpoint_problems(checkpoint):
                report.problems.append(Problem("checkpoint", None, GLOBAL_CHAIN, None, message))
    return report


def _recorded_purges(chains: list[str] | None) -> set[str]:
    """Run chains whose deletion a task.purged event of the global chain records."""
    qs = AuditEvent.objects.filter(chain=GLOBAL_CHAIN, action="task.purged")
    if chains is not None:
        wanted = Q()
        for name in chains:
            wanted |= Q(payload__chains__contains=[{"chain": name}])
        qs = qs.filter(wanted) if chains else qs.none()
    names: set[str] = set()
    for payload in qs.values_list("payload", flat=True).iterator(chunk_size=BATCH):
        names.update(c.get("chain") for c in payload.get("chains", []) if isinstance(c, dict))
    return names


def _check(event: AuditEvent, expected_seq: int, prev_hash: str) -> Problem | None:
    if event.seq > expected_seq:
        missing = f"{expected_seq}" if event.seq == expected_seq + 1 else f"{expected_seq}..{event.seq - 1}"
        return Problem(
            "missing", event.pk, event.chain, event.seq, f"events with seq {missing} before it are missing"
        )
    if event.seq < expected_seq:
        return Problem(
            "reordered", event.pk, event.chain, event.seq, "its sequence number repeats an earlier one"
        )
    if event.prev_hash != prev_hash:
        return Problem(
            "reordered", event.pk, event.chain, event.seq, "it does not link to the event before it"
        )
    if chain.digest(event.prev_hash, chain.event_content(event)) != event.hash:
        return Problem("altered", event.pk, event.chain, event.seq, "its content does not match its hash")
    return None
