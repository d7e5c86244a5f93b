"""The proof of each run of a dossier bundle, with the public key alone (no Django, no database):
its chain recomputed, its seal's leaf in the audit log under a signed tree head (or, for a run sealed
before the log, the old per-chain checkpoint), its seal, and for a chain deleted under the retention
policy its signed purge. audit.bundle runs these for each run; audit.bundle_values checks the values
the dossier shows against the events proven here.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from . import merkle, note
from .proof import GENESIS, canonical, digest, seal_leaf

RUN = "run"  # the object type a run's pending seal records (its model's name: audit.seals.pending_seal)
ENDED = ("succeeded", "failed")


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def _signature_holds(body: dict[str, Any], signature: str, key: Ed25519PublicKey) -> bool:
    try:
        key.verify(bytes.fromhex(signature), canonical(body))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


class Run:
    """One run of a bundle: its events by what they describe."""

    def __init__(self, run: dict[str, Any]):
        self.run = run
        self.id = str(run.get("id"))
        self.chain = str(run.get("chain", ""))
        self.events: list[dict[str, Any]] = list(run.get("events") or [])
        self.holds = False  # its chain recomputed and intact, not purged (set by verify_bundle)
        self.last: dict[tuple[str, str], dict[str, Any]] = {}
        self.by_action: dict[str, list[dict[str, Any]]] = {}
        for event in self.events:
            content = event.get("content") or {}
            self.last[(content.get("action"), str(content.get("object_id")))] = content
            self.by_action.setdefault(content.get("action"), []).append(content)

    def event(self, action: str, object_id: Any) -> dict[str, Any] | None:
        return self.last.get((action, str(object_id)))

    def of(self, object_type: str) -> list[dict[str, Any]]:
        """The contents of its events about objects of this type, in chain order."""
        return [
            c for c in (e.get("content") or {} for e in self.events) if c.get("object_type") == object_type
        ]

    @property
    def end(self) -> tuple[Any, Any] | None:
        """(seq, hash) where the chain ends: its last event in the bundle, or for a chain deleted
        under the retention policy the head its signed purge emptied; None for an empty chain."""
        purge = self.run.get("purge")
        if purge:
            body = purge.get("body") or {}
            return body.get("last_seq"), body.get("last_hash")
        if not self.events:
            return None
        return (self.events[-1].get("content") or {}).get("seq"), self.events[-1].get("hash")

    def recorded_status(self) -> str:
        """The run's status as its chain records it."""
        for status in ENDED:
            if self.event(f"run.{status}", self.id) is not None:
                return status
        if self.event("run.started", self.id) or self.event("run.resumed", self.id):
            return "running"
        return "queued"


def chain_problems(run: Run, task_id: Any = None) -> Iterator[str]:
    """The chain recomputed: each event's hash from its content and the hash before it, each an event
    of this bundle's task (`task_id`, when given)."""
    previous, expected = GENESIS, 1
    for event in run.events:
        content = event.get("content") or {}
        where = f"{run.chain} seq {content.get('seq')} (event #{event.get('id')})"
        if content.get("chain") != run.chain:
            yield f"{where}: it belongs to chain {content.get('chain')!r}, not this run's"
            return
        if content.get("seq") != expected:
            yield f"{where}: the chain jumps from seq {expected - 1} to seq {content.get('seq')}"
            return
        if event.get("prev_hash") != previous:
            yield f"{where}: it does not link to the event before it"
            return
        if digest(event.get("prev_hash", ""), content) != event.get("hash"):
            yield f"{where}: its content was altered (its hash does not match it)"
            return
        if task_id is not None and content.get("task_id") != task_id:
            yield f"{where}: it is an event of task {content.get('task_id')}, not of this bundle's task {task_id}"
            return
        previous, expected = event["hash"], expected + 1


def tree_head_number(head: note.TreeHead) -> str | None:
    """The checkpoint number a tree head's extension lines carry (`number N`)."""
    return next((line.split(" ", 1)[1] for line in head.extensions if line.startswith("number ")), None)


def log_problems(run: Run, task_id: Any, key: Ed25519PublicKey) -> Iterator[str]:
    """The run's seal as a leaf of the audit log: the leaf rebuilt from where its chain ends and the
    run it names, its audit path to the root of the bundled tree head, and that tree head's note
    signed by the trusted key (its name the note's origin)."""
    log = run.run.get("log") or {}
    signed = log.get("checkpoint")
    try:
        text, _ = note.split(signed if isinstance(signed, str) else "")
        head = note.opened(signed, note.tree_head(text).origin, key)
    except note.NoteError as exc:
        yield f"{run.chain}: the tree head its log section carries does not hold with the trusted key: {exc}"
        return
    label = f"the signed tree head of {head.size} leaves (checkpoint {tree_head_number(head)})"
    if log.get("tree_size") != head.size:
        yield f"{run.chain}: its log section says tree size {log.get('tree_size')!r}; {label} is of size {head.size}"
    if log.get("root") != head.root.hex() or log.get("root_base64") != base64.b64encode(head.root).decode():
        yield f"{run.chain}: its log section says root {str(log.get('root'))[:12]}; {label} signs {head.root.hex()[:12]}"
    if str(log.get("checkpoint_number")) != str(tree_head_number(head)):
        yield f"{run.chain}: its log section says checkpoint {log.get('checkpoint_number')!r}; its signed note is checkpoint {tree_head_number(head)}"
    end = run.end
    if end is None:
        yield f"{run.chain}: the bundle carries no event of its chain to rebuild its leaf in the log from"
        return
    seq, hash_ = end
    leaf = seal_leaf(
        chain=run.chain, seq=seq, hash_=hash_, object_type=RUN, object_id=run.id, task_id=task_id
    )
    index = log.get("leaf_index")
    try:
        path = [bytes.fromhex(h) for h in log.get("audit_path") or []]
    except (TypeError, ValueError):
        yield f"{run.chain}: its log section's audit path is not a list of hex hashes"
        return
    proven = (
        isinstance(index, int)
        and not isinstance(index, bool)
        and merkle.inclusion_verify(index, head.size, merkle.leaf_hash(leaf), path, head.root)
    )
    shown_leaf = log.get("leaf") == leaf.decode() and log.get("leaf_hash") == merkle.leaf_hash(leaf).hex()
    if not shown_leaf:
        yield (
            f"{run.chain}: the leaf its log section shows is not the chain's end: it is {str(log.get('leaf'))[:160]!r}"
            f" (hash {str(log.get('leaf_hash'))[:12]}); the chain's end (seq {seq}, {str(hash_)[:12]}) of run"
            f" {run.id} of task {task_id} makes {leaf.decode()[:160]!r}"
        )
    elif not proven:
        yield (
            f"{run.chain}: the audit path does not lead from its leaf (index {index!r}) to the root of {label}:"
            " an audit path hash or the leaf index was changed"
        )


def checkpoint_problems(run: Run, key: Ed25519PublicKey) -> Iterator[str]:
    """The signed checkpoint of before the log (the heads of every chain that moved), and what it does
    not cover."""
    checkpoint = run.run.get("checkpoint")
    if not checkpoint:
        yield f"{run.chain}: no signed checkpoint covers this chain yet (no signed tree head of the log includes its seal)"
        return
    body = checkpoint.get("body") or {}
    label = f"checkpoint {body.get('number')}"
    if not _signature_holds(body, checkpoint.get("signature", ""), key):
        yield f"{label}: its signature does not hold with the trusted key"
        return
    head = (body.get("heads") or {}).get(run.chain)
    if not head:
        yield f"{label} does not sign chain {run.chain}"
        return
    seq, signed_hash = head
    event = next((e for e in run.events if (e.get("content") or {}).get("seq") == seq), None)
    if event is None:
        yield f"{label} signed seq {seq} of {run.chain}; the bundle has no such event"
    elif event.get("hash") != signed_hash:
        yield f"{label} signed seq {seq} of {run.chain} with hash {signed_hash[:12]}; the bundle's is {str(event.get('hash'))[:12]}"
    later = [e for e in run.events if (e.get("content") or {}).get("seq", 0) > seq]
    if later:
        yield f"{run.chain}: seq {seq + 1} to {seq + len(later)} come after {label} and no checkpoint covers them"


def seal_problems(run: Run) -> Iterator[str]:
    seal = run.run.get("seal")
    if run.run.get("status") not in ("succeeded", "failed"):
        return
    if not seal:
        yield f"{run.chain}: the run is {run.run.get('status')}, but the bundle has no seal of its chain"
        return
    content = seal.get("content") or {}
    if digest(seal.get("prev_hash", ""), content) != seal.get("hash"):
        yield f"the seal of {run.chain} was altered (its hash does not match it)"
        return
    payload = content.get("payload") or {}
    tail = run.events[-1] if run.events else {}
    if payload.get("chain") != run.chain or payload.get("hash") != tail.get("hash"):
        yield (
            f"the seal of {run.chain} closes it at seq {payload.get('seq')} ({str(payload.get('hash'))[:12]}); "
            f"the bundle's chain ends at seq {(tail.get('content') or {}).get('seq')} ({str(tail.get('hash'))[:12]})"
        )


def purge_problems(run: Run, key: Ed25519PublicKey) -> Iterator[str]:
    """A chain deleted under the retention policy: its signed purge, and the seal it must match."""
    purge = run.run.get("purge") or {}
    body = purge.get("body") or {}
    if not _signature_holds(body, purge.get("signature", ""), key):
        yield f"{run.chain}: its events were deleted under a purge whose signature does not hold"
        return
    if body.get("chain") != run.chain:
        yield f"{run.chain}: its purge is signed for chain {body.get('chain')!r}"
        return
    seal = run.run.get("seal") or {}
    content = seal.get("content") or {}
    if digest(seal.get("prev_hash", ""), content) != seal.get("hash"):
        yield f"the seal of {run.chain} was altered (its hash does not match it)"
        return
    payload = content.get("payload") or {}
    if (payload.get("seq"), payload.get("hash")) != (body.get("last_seq"), body.get("last_hash")):
        yield f"{run.chain}: its purge emptied it at seq {body.get('last_seq')}; its seal closed it at seq {payload.get('seq')}"
