"""Verify an exported dossier bundle with the public key alone: no database, no settings, no Django.

    python -m audit.bundle verify dossier.json --public-key audit-public.pem

A bundle (`?download=bundle` on a task's dossier) carries what the dossier shows (the task, its runs'
decisions, steps and attempts) and the proof of it: each run's chain of events, the seal that closed
it and its place in the audit log. This checks, for each run:

1. the chain: every event's hash recomputed from its content and the previous hash (audit.proof), the
   sequence unbroken from its first event, every event one of this task's;
2. the log (`log`): the leaf rebuilt from the chain's last event and the run it names (proof.seal_leaf,
   what the run's pending seal holds), its audit path to the root of the bundled tree head (RFC 9162,
   audit.merkle), and that tree head's note signed by the trusted key (never a key the bundle carries;
   audit.note). A run sealed before the log has a `checkpoint` instead: its Ed25519 signature over its
   body, and the head it signs for this chain, which must be an event of the chain with that hash;
3. the seal: its own hash, and that it closes the chain at its last event (for a chain deleted
   under the retention policy: the purge's signature, and that it emptied the chain the seal closed);
4. the values: each one the dossier shows against the event that recorded it when it happened (a
   task's text and classification, a plan and what the conductor wrote, a step's worker, vendor,
   instruction, messages, response and status, an attempt's status and cost, a run's kind, conductor,
   answer, score, status and cost), every step, attempt, decision and run an event records present in
   the bundle, and the task's status, answer, score and cost against its runs'; a purge the task
   claims proven by its runs' signed purges.

It prints each mismatch it finds and exits 1, or prints what it proved and the fields that no event
binds (what it did not prove) and exits 0. See docs/audit.md for what a bundle proves and what not.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from . import merkle, note
from .proof import GENESIS, canonical, content_hash, digest, money, seal_leaf

FORMAT = "conductor-web/dossier-bundle/1"
CONDUCTOR = "conductor"  # a step given back to the conductor: answered without a call of its own
RUN = "run"  # the object type a run's pending seal records (its model's name: audit.seals.pending_seal)
ENDED = ("succeeded", "failed")
OWN = ("live", "retry")  # the runs that answer for their task
STEP_EVENTS = {"step.succeeded": "succeeded", "step.failed": "failed", "step.skipped": "skipped"}


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


class _Run:
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


def _differs(content: dict[str, Any], what: str, recorded: Any, shown: Any) -> str:
    return (
        f"{content.get('chain')} seq {content.get('seq')}: {what} is {shown!r} in the dossier; "
        f"its {content.get('action')} event recorded {recorded!r}"
    )


def _hash_differs(content: dict[str, Any], what: str, recorded: Any, shown: Any) -> Iterator[str]:
    """A value the event recorded by its sha256, against the value the dossier shows."""
    if recorded != content_hash(shown):
        yield _differs(content, f"{what} (sha256)", recorded, content_hash(shown))


def chain_problems(run: _Run, task_id: Any = None) -> Iterator[str]:
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


def _number(head: note.TreeHead) -> str | None:
    """The checkpoint number a tree head's extension lines carry (`number N`)."""
    return next((line.split(" ", 1)[1] for line in head.extensions if line.startswith("number ")), None)


def log_problems(run: _Run, task_id: Any, key: Ed25519PublicKey) -> Iterator[str]:
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
    label = f"the signed tree head of {head.size} leaves (checkpoint {_number(head)})"
    if log.get("tree_size") != head.size:
        yield f"{run.chain}: its log section says tree size {log.get('tree_size')!r}; {label} is of size {head.size}"
    if log.get("root") != head.root.hex() or log.get("root_base64") != base64.b64encode(head.root).decode():
        yield f"{run.chain}: its log section says root {str(log.get('root'))[:12]}; {label} signs {head.root.hex()[:12]}"
    if str(log.get("checkpoint_number")) != str(_number(head)):
        yield f"{run.chain}: its log section says checkpoint {log.get('checkpoint_number')!r}; its signed note is checkpoint {_number(head)}"
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


def checkpoint_problems(run: _Run, key: Ed25519PublicKey) -> Iterator[str]:
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


def seal_problems(run: _Run) -> Iterator[str]:
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


def purge_problems(run: _Run, key: Ed25519PublicKey) -> Iterator[str]:
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


def value_problems(run: _Run) -> Iterator[str]:
    """Each value of the run that the dossier shows, against the event that recorded it; and each
    decision, step and attempt an event records, present in the dossier."""
    data = run.run
    plans: dict[str, dict[str, Any]] = {}
    for action in ("plan.emitted", "plan.rejected", "plan.blocked"):
        for content in run.by_action.get(action, []):
            plans[str(content.get("object_id"))] = content
    shown_decisions = {str(d.get("id")) for d in data.get("decisions") or []}
    for decision_id, content in plans.items():
        if decision_id not in shown_decisions:
            yield f"{run.chain} seq {content.get('seq')}: decision {decision_id} is recorded by its {content.get('action')} event, but is not in the dossier"
    for decision in data.get("decisions") or []:
        event = plans.get(str(decision.get("id")))
        if event is None:
            yield f"{run.chain}: decision {decision.get('id')} is in the dossier, but no event records it"
            continue
        for field in ("raw_output", "plan", "alternatives"):
            if (event.get("payload") or {}).get(field) != decision.get(field):
                yield _differs(
                    event,
                    f"decision {decision.get('id')}'s {field} (sha256)",
                    content_hash((event.get("payload") or {}).get(field)),
                    content_hash(decision.get(field)),
                )
    yield from _step_problems(run, plans)
    yield from _attempt_problems(run)
    yield from _run_problems(run)


def _step_problems(run: _Run, plans: dict[str, dict[str, Any]]) -> Iterator[str]:
    steps = run.run.get("steps") or []
    shown = {str(s.get("id")) for s in steps}
    first: dict[str, dict[str, Any]] = {}
    for content in run.of("step"):
        first.setdefault(str(content.get("object_id")), content)
    for sid, content in first.items():
        if sid not in shown:
            yield f"{run.chain} seq {content.get('seq')}: step {sid} is recorded by its {content.get('action')} event, but is not in the dossier"
    for step in steps:
        sid = step.get("id")
        plan_event = plans.get(str(step.get("decision_id")))
        written = (((plan_event or {}).get("payload") or {}).get("plan") or {}).get("steps") or []
        if (
            plan_event is not None
            and isinstance(step.get("index"), int)
            and 0 <= step["index"] < len(written)
        ):
            planned = written[step["index"]]
            if planned.get("instruction") != step.get("instruction"):
                yield _differs(
                    plan_event,
                    f"step {sid}'s instruction (sha256)",
                    content_hash(planned.get("instruction")),
                    content_hash(step.get("instruction")),
                )
        started = run.event("step.started", sid)
        if started is not None:
            p = started.get("payload") or {}
            for field in ("worker", "vendor", "index", "depth"):
                if field in p and p.get(field) != step.get(field):
                    yield _differs(started, f"step {sid}'s {field}", p.get(field), step.get(field))
            if p.get("messages_sha256") not in (None, content_hash(step.get("messages_sent"))):
                yield _differs(
                    started,
                    f"step {sid}'s messages (sha256)",
                    p.get("messages_sha256"),
                    content_hash(step.get("messages_sent")),
                )
        succeeded = run.event("step.succeeded", sid)
        if succeeded is not None:
            p = succeeded.get("payload") or {}
            yield from _hash_differs(
                succeeded, f"step {sid}'s response", p.get("response_sha256"), step.get("response")
            )
            if p.get("worker") not in (CONDUCTOR, step.get("worker")):
                yield _differs(succeeded, f"step {sid}'s worker", p.get("worker"), step.get("worker"))
        settled = [
            c
            for c in run.of("step")
            if str(c.get("object_id")) == str(sid) and c.get("action") in STEP_EVENTS
        ]
        if settled:
            recorded = STEP_EVENTS[settled[-1]["action"]]
            if step.get("status") != recorded:
                yield _differs(settled[-1], f"step {sid}'s status", recorded, step.get("status"))
        elif step.get("status") in STEP_EVENTS.values():
            yield f"{run.chain}: step {sid} is {step.get('status')} in the dossier, but no event records it"


def _attempt_problems(run: _Run) -> Iterator[str]:
    shown = run.run.get("attempts") or []
    attempts = {(str(a.get("step_id")), a.get("number")): a for a in shown}
    by_id = {str(a.get("id")): a for a in shown}
    for content in run.by_action.get("step.succeeded", []):
        p = content.get("payload") or {}
        if "attempt" not in p:
            continue
        attempt = attempts.get((str(content.get("object_id")), p["attempt"]))
        if attempt is None:
            yield f"{run.chain}: attempt {p['attempt']} of step {content.get('object_id')} is not in the dossier"
            continue
        if attempt.get("status") != "succeeded":
            yield _differs(
                content, f"attempt {attempt.get('id')}'s status", "succeeded", attempt.get("status")
            )
        if money(p.get("cost_usd")) != money(attempt.get("cost_usd")):
            yield _differs(
                content, f"attempt {attempt.get('id')}'s cost_usd", p.get("cost_usd"), attempt.get("cost_usd")
            )
        for tokens in ("input_tokens", "output_tokens"):
            if p.get(tokens) != attempt.get(tokens):
                yield _differs(
                    content, f"attempt {attempt.get('id')}'s {tokens}", p.get(tokens), attempt.get(tokens)
                )
    for content in run.by_action.get("attempt.failed", []):
        p = content.get("payload") or {}
        attempt = by_id.get(str(content.get("object_id")))
        if attempt is None:
            yield f"{run.chain}: attempt {p.get('number')} of step {p.get('step_id')} is recorded by its attempt.failed event (seq {content.get('seq')}), but is not in the dossier"
            continue
        for field in ("status", "http_status"):
            if p.get(field) != attempt.get(field):
                yield _differs(
                    content, f"attempt {attempt.get('id')}'s {field}", p.get(field), attempt.get(field)
                )
    for content in run.by_action.get("run.resumed", []):
        for lost in (content.get("payload") or {}).get("lost_attempts") or []:
            attempt = attempts.get((str(lost.get("step_id")), lost.get("attempt")))
            if attempt is None:
                yield f"{run.chain}: attempt {lost.get('attempt')} of step {lost.get('step_id')} is recorded by its run.resumed event (seq {content.get('seq')}), but is not in the dossier"
            elif "cost_usd" in lost and money(lost["cost_usd"]) != money(attempt.get("cost_usd")):
                yield _differs(
                    content,
                    f"lost attempt {attempt.get('id')}'s estimated cost_usd",
                    lost["cost_usd"],
                    attempt.get("cost_usd"),
                )


def _run_problems(run: _Run) -> Iterator[str]:
    data = run.run
    for content in run.of(RUN):
        if str(content.get("object_id")) != run.id:
            yield f"{run.chain} seq {content.get('seq')}: its {content.get('action')} event is of run {content.get('object_id')}, not of run {run.id}"
            return
    started = run.event("run.started", run.id) or run.event("run.resumed", run.id)
    if started is not None and "conductor" in (started.get("payload") or {}):
        recorded = started["payload"]["conductor"]
        if recorded != data.get("conductor"):
            yield _differs(started, f"run {run.id}'s conductor", recorded, data.get("conductor"))
    status, recorded = data.get("status"), run.recorded_status()
    if status in ENDED and recorded != status and run.event(f"run.{status}", run.id) is None:
        yield f"{run.chain}: the run is {status} in the dossier, but no event records it"
        return
    if status != recorded:
        yield f"{run.chain}: the run is {status} in the dossier; its chain records it {recorded}"
        return
    if status not in ENDED:
        return
    ended = run.event(f"run.{status}", run.id) or {}
    p = ended.get("payload") or {}
    if status == "succeeded":
        yield from _hash_differs(
            ended, f"run {run.id}'s final answer", p.get("final_answer_sha256"), data.get("final_answer")
        )
        if "cost_usd" in p and money(p["cost_usd"]) != money(data.get("cost_usd")):
            yield _differs(ended, f"run {run.id}'s cost_usd", p["cost_usd"], data.get("cost_usd"))
        if "score" in p and p["score"] != data.get("score"):
            yield _differs(ended, f"run {run.id}'s score", p["score"], data.get("score"))
        if data.get("stop_reason"):
            yield _differs(ended, f"run {run.id}'s stop_reason", "", data.get("stop_reason"))
    elif p.get("stop_reason") != data.get("stop_reason"):
        yield _differs(ended, f"run {run.id}'s stop_reason", p.get("stop_reason"), data.get("stop_reason"))


def _kinds(runs: list[_Run]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each run id that an intact chain's event names as one of the task's, with its kind and that event."""
    kinds: dict[str, tuple[str, dict[str, Any]]] = {}
    for run in runs:
        if not run.holds:
            continue
        for content in run.by_action.get("task.submitted", []):
            p = content.get("payload") or {}
            kinds[str(p.get("run_id"))] = ("live", content)
            if isinstance(p.get("shadow"), dict):
                kinds[str(p["shadow"].get("run_id"))] = ("shadow", content)
        for content in run.by_action.get("task.retried", []):
            kinds[str((content.get("payload") or {}).get("run_id"))] = ("retry", content)
    return kinds


def _when(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def task_problems(task: dict[str, Any], runs: list[_Run]) -> Iterator[str]:
    """The task against its runs: its text and classification against its task.submitted event (in its
    live run's chain), a purge it claims against its runs' signed purges, its runs against those the
    events name, and its status, answer, score and cost against its own runs'."""
    if not runs:
        claims = {
            "status": task.get("status"),
            "cost_usd": task.get("cost_usd"),
            "final_answer": task.get("final_answer"),
            "score": task.get("score"),
        }
        if (
            task.get("status") != "queued"
            or money(task.get("cost_usd"))
            or task.get("final_answer")
            or task.get("score") is not None
        ):
            yield f"the task is {claims} in the dossier, but the bundle carries none of its runs: nothing in it proves that"
        return
    purged_at = task.get("purged_at")
    submitted = next((c for r in runs if r.holds for c in r.by_action.get("task.submitted", [])), None)
    if purged_at:
        yield from _purge_claim_problems(task, runs, submitted)
    if submitted is not None:
        p = submitted.get("payload") or {}
        if str(submitted.get("object_id")) != str(task.get("id")):
            yield _differs(submitted, "the task's id", submitted.get("object_id"), task.get("id"))
        if p.get("classification") != task.get("classification"):
            yield _differs(
                submitted, "the task's classification", p.get("classification"), task.get("classification")
            )
        if "text_sha256" in p and p["text_sha256"] != content_hash(task.get("text")):
            yield _differs(
                submitted, "the task's text (sha256)", p["text_sha256"], content_hash(task.get("text"))
            )
    kinds = _kinds(runs)
    shown = {r.id: r for r in runs}
    for run_id, (kind, content) in kinds.items():
        if run_id not in shown:
            yield f"{content.get('chain')} seq {content.get('seq')}: run {run_id} is the task's {kind} run (its {content.get('action')} event), but the bundle does not carry it"
        elif shown[run_id].run.get("kind") != kind:
            yield _differs(content, f"run {run_id}'s kind", kind, shown[run_id].run.get("kind"))
    if all(r.run.get("status") in ENDED for r in runs):
        total = sum((money(r.run.get("cost_usd")) or Decimal(0) for r in runs), Decimal(0))
        if money(task.get("cost_usd")) != total:
            yield f"the task's cost_usd is {task.get('cost_usd')!r} in the dossier, but its runs' add up to {total}"
    own = sorted((r for r in runs if r.run.get("kind") in OWN), key=lambda r: _int(r.id))
    if not own:
        return
    if task.get("status") != own[-1].run.get("status"):
        yield f"the task is {task.get('status')} in the dossier, but its last own run {own[-1].id} is {own[-1].run.get('status')}"
    if purged_at and submitted is None:
        return  # its answer is gone with its content
    answered = [
        (_when((r.event("run.succeeded", r.id) or {}).get("occurred_at")), r)
        for r in own
        if r.run.get("status") == "succeeded" and r.event("run.succeeded", r.id)
    ]
    last = max((pair for pair in answered if pair[0] is not None), key=lambda pair: pair[0], default=None)
    answer, score = (last[1].run.get("final_answer"), last[1].run.get("score")) if last else ("", None)
    if content_hash(task.get("final_answer")) != content_hash(answer):
        yield (
            f"the task's final answer (sha256 {content_hash(task.get('final_answer'))[:12]}) is not its answering"
            f" run's ({'run ' + last[1].id if last else 'none answered'}: sha256 {content_hash(answer)[:12]})"
        )
    if task.get("score") != score:
        yield f"the task's score is {task.get('score')!r} in the dossier, but its answering run's is {score!r}"


def _purge_claim_problems(
    task: dict[str, Any], runs: list[_Run], submitted: dict[str, Any] | None
) -> Iterator[str]:
    """A task the bundle says was purged: every run chain emptied, at least one by a signed purge (each
    checked by purge_problems), purged when the task says."""
    purged_at = task.get("purged_at")
    if submitted is not None:
        yield (
            f"{submitted.get('chain')} seq {submitted.get('seq')}: the task is purged in the dossier (purged_at"
            f" {purged_at}), but its chain still holds its task.submitted event: it was not purged"
        )
    for run in runs:
        if run.events and not run.run.get("purge"):
            yield f"{run.chain}: the task is purged in the dossier, but its chain still holds {len(run.events)} event(s) and no signed purge"
    purges = [r for r in runs if r.run.get("purge")]
    if not purges:
        yield f"the task is purged in the dossier (purged_at {purged_at}), but no signed purge in the bundle proves it"
    for run in purges:
        signed = ((run.run.get("purge") or {}).get("body") or {}).get("purged_at")
        if _when(signed) is None or _when(signed) != _when(purged_at):
            yield f"{run.chain}: the task's purged_at is {purged_at!r} in the dossier; its signed purge says {signed!r}"


def _int(value: Any) -> tuple[int, str]:
    try:
        return int(value), ""
    except (TypeError, ValueError):
        return 0, str(value)


def unproven(bundle: dict[str, Any], runs: list[_Run]) -> list[str]:
    """The fields an intact bundle shows that no event binds (what it does not prove), briefly."""
    task = bundle.get("task") or {}
    out = ["exported_at, exported_by: the bundle's own, signed by nothing"]
    if not runs:
        return [*out, "the task's every field: the bundle carries none of its runs"]
    submitted = any(r.holds and r.by_action.get("task.submitted") for r in runs)
    if task.get("purged_at"):
        out.append(
            "the task's text and answer and its runs' content: deleted under the retention policy (the purge is proven)"
        )
    elif not submitted:
        out.append(
            "the task's text and classification: no task.submitted event in the bundle (a training task's is in the global chain)"
        )
    kinds = _kinds(runs)
    costs_bound = all(r.holds and r.run.get("status") == "succeeded" for r in runs)
    if not all(r.run.get("status") in ENDED for r in runs):
        out.append("the task's cost_usd: a run is still going")
    elif not costs_bound:
        out.append("the task's cost_usd: it sums run costs that no event binds")
    if not any(r.run.get("kind") in OWN for r in runs):
        out.append("the task's status, final answer and score: none of its runs is its own (live or retry)")
    for run in runs:
        label = f"run {run.id}"
        if run.run.get("purge"):
            out.append(
                f"{label}: its status, kind, conductor, cost, decisions, steps and attempts (its chain was emptied by the purge)"
            )
            continue
        fields = []
        if run.id not in kinds:
            fields.append("its kind")
        if not (run.event("run.started", run.id) or run.event("run.resumed", run.id)):
            fields.append("its conductor")
        if run.run.get("status") != "succeeded":
            fields.append(
                "its cost_usd, score" + (" and final answer" if run.run.get("final_answer") else "")
            )
        recorded = {str(c.get("object_id")) for c in run.of("step")}
        bare = [str(s.get("id")) for s in run.run.get("steps") or [] if str(s.get("id")) not in recorded]
        if bare:
            fields.append(
                f"the status, vendor and messages of step(s) {', '.join(bare)} (no event of their own yet)"
            )
        answered = {str(c.get("object_id")) for c in run.by_action.get("step.succeeded", [])}
        unanswered = [
            str(s.get("id"))
            for s in run.run.get("steps") or []
            if s.get("response") and str(s.get("id")) not in answered
        ]
        if unanswered:
            fields.append(f"the response of step(s) {', '.join(unanswered)} (not succeeded)")
        paid = {
            (str(c.get("object_id")), (c.get("payload") or {}).get("attempt"))
            for c in run.by_action.get("step.succeeded", [])
        }
        failed = {str(c.get("object_id")) for c in run.by_action.get("attempt.failed", [])}
        unpaid = [
            str(a.get("id"))
            for a in run.run.get("attempts") or []
            if (str(a.get("step_id")), a.get("number")) not in paid
        ]
        if unpaid:
            fields.append(f"the cost and tokens of attempt(s) {', '.join(unpaid)} (not succeeded)")
        unrecorded = [a for a in unpaid if a not in failed]
        if unrecorded:
            fields.append(f"the status of attempt(s) {', '.join(unrecorded)} (no event of their own)")
        if run.run.get("attempts") and paid:
            fields.append("its succeeded attempts' http_status")
        if fields:
            out.append(f"{label}: {'; '.join(fields)}")
    return out


def verify_bundle(bundle: dict[str, Any], key: Ed25519PublicKey) -> list[str]:
    """Every mismatch in the bundle, as sentences (empty: it holds)."""
    return verified(bundle, key)[0]


def verified(bundle: dict[str, Any], key: Ed25519PublicKey) -> tuple[list[str], list[str]]:
    """Every mismatch in the bundle, as sentences (empty: it holds), and the fields it does not prove."""
    if bundle.get("format") != FORMAT:
        return [f"not a dossier bundle of format {FORMAT} (found {bundle.get('format')!r})"], []
    task = bundle.get("task") or {}
    task_id = str(task.get("id")) if task.get("id") is not None else None
    runs = [_Run(r) for r in bundle.get("runs") or []]
    problems: list[str] = []
    for run in runs:
        if run.run.get("purge"):
            problems += purge_problems(run, key)  # its content and events are gone by design
            if run.run.get("log"):
                problems += log_problems(run, task_id, key)
            continue
        broken = list(chain_problems(run, task_id))
        problems += broken
        problems += log_problems(run, task_id, key) if run.run.get("log") else checkpoint_problems(run, key)
        problems += seal_problems(run)
        if not broken:  # values are read against events only once the events hold
            run.holds = True
            problems += value_problems(run)
    problems += task_problems(task, runs)
    return problems, unproven(bundle, runs)


def _signed_by(runs: list[dict[str, Any]]) -> list[str]:
    """The checkpoints that sign the bundle's runs: each tree head's number, each old checkpoint's."""
    numbers = set()
    for run in runs:
        signed = (run.get("log") or {}).get("checkpoint")
        if isinstance(signed, str):
            try:
                numbers.add(_number(note.tree_head(note.split(signed)[0])))
            except note.NoteError:
                continue
        elif (run.get("checkpoint") or {}).get("body", {}).get("number") is not None:
            numbers.add(str(run["checkpoint"]["body"]["number"]))
    return sorted((n for n in numbers if n is not None), key=_int)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audit.bundle", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="verify a dossier bundle with the public key")
    check.add_argument("bundle", type=Path)
    check.add_argument("--public-key", type=Path, required=True, help="the audit public key (PEM)")
    args = parser.parse_args(argv)
    try:
        bundle = json.loads(args.bundle.read_text(encoding="utf-8"))
        key = load_public_key(args.public_key.read_bytes())
    except (OSError, ValueError) as exc:
        print(f"cannot verify: {exc}", file=sys.stderr)
        return 2
    problems, not_proven = verified(bundle, key)
    if problems:
        print(f"NOT INTACT: {len(problems)} mismatch(es)")
        for problem in problems:
            print(f"- {problem}")
        return 1
    runs = bundle.get("runs") or []
    events = sum(len(r.get("events") or []) for r in runs)
    print(
        f"intact: task {(bundle.get('task') or {}).get('id')}, {len(runs)} run(s), {events} events,"
        f" signed by checkpoint(s) {', '.join(_signed_by(runs)) or 'none'}"
    )
    print("not proven (no event binds them):")
    for field in not_proven:
        print(f"- {field}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
