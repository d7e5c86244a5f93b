"""Verify an exported dossier bundle with the public key alone: no database, no settings, no Django.

    python -m audit.bundle verify dossier.json --public-key audit-public.pem

A bundle (`?download=bundle` on a task's dossier) carries what the dossier shows (the task, its runs'
decisions, steps and attempts) and the proof of it: each run's chain of events, the seal that closed
it and the signed checkpoint that covers it. This checks, for each run:

1. the chain: every event's hash recomputed from its content and the previous hash (audit.proof), the
   sequence unbroken from its first event;
2. the checkpoint: its Ed25519 signature over its body with the trusted key (never a key the bundle
   carries), and the head it signs for this chain, which must be an event of the chain with that hash;
   events after it are named as not covered;
3. the seal: its own hash, and that it closes the chain at its last event (for a chain deleted
   under the retention policy: the purge's signature, and that it emptied the chain the seal closed);
4. the values: each one the dossier shows against the event that recorded it when it happened (a
   task's text and classification, a plan and what the conductor wrote, a step's worker, vendor,
   instruction, messages and response, an attempt's cost, a run's answer, status and cost).

It prints each mismatch it finds and exits 1, or prints what it proved and exits 0. See docs/audit.md
for what a bundle proves and what it does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .proof import GENESIS, canonical, content_hash, digest, money

FORMAT = "conductor-web/dossier-bundle/1"
CONDUCTOR = "conductor"  # a step given back to the conductor: answered without a call of its own


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
        self.chain = str(run.get("chain", ""))
        self.events: list[dict[str, Any]] = list(run.get("events") or [])
        self.last: dict[tuple[str, str], dict[str, Any]] = {}
        self.by_action: dict[str, list[dict[str, Any]]] = {}
        for event in self.events:
            content = event.get("content") or {}
            self.last[(content.get("action"), str(content.get("object_id")))] = content
            self.by_action.setdefault(content.get("action"), []).append(content)

    def event(self, action: str, object_id: Any) -> dict[str, Any] | None:
        return self.last.get((action, str(object_id)))


def _differs(content: dict[str, Any], what: str, recorded: Any, shown: Any) -> str:
    return (
        f"{content.get('chain')} seq {content.get('seq')}: {what} is {shown!r} in the dossier; "
        f"its {content.get('action')} event recorded {recorded!r}"
    )


def _hash_differs(content: dict[str, Any], what: str, recorded: Any, shown: Any) -> Iterator[str]:
    """A value the event recorded by its sha256, against the value the dossier shows."""
    if recorded != content_hash(shown):
        yield _differs(content, f"{what} (sha256)", recorded, content_hash(shown))


def chain_problems(run: _Run) -> Iterator[str]:
    """The chain recomputed: each event's hash from its content and the hash before it."""
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
        previous, expected = event["hash"], expected + 1


def checkpoint_problems(run: _Run, key: Ed25519PublicKey) -> Iterator[str]:
    """The signed checkpoint that covers the chain, and what it does not cover."""
    checkpoint = run.run.get("checkpoint")
    if not checkpoint:
        yield f"{run.chain}: no signed checkpoint covers this chain"
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
    """Each value of the run that the dossier shows, against the event that recorded it."""
    data = run.run
    plans: dict[str, dict[str, Any]] = {}
    for action in ("plan.emitted", "plan.rejected", "plan.blocked"):
        for content in run.by_action.get(action, []):
            plans[str(content.get("object_id"))] = content
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
    for step in data.get("steps") or []:
        sid = step.get("id")
        plan_event = plans.get(str(step.get("decision_id")))
        written = (((plan_event or {}).get("payload") or {}).get("plan") or {}).get("steps") or []
        if plan_event is not None and step.get("index", 0) < len(written):
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
            for field, name in (("worker", "worker"), ("vendor", "vendor")):
                if p.get(field) != step.get(name):
                    yield _differs(started, f"step {sid}'s {name}", p.get(field), step.get(name))
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
        elif step.get("status") == "succeeded":
            yield f"{run.chain}: step {sid} is succeeded in the dossier, but no event records it"
    attempts = {(a.get("step_id"), a.get("number")): a for a in data.get("attempts") or []}
    for content in run.by_action.get("step.succeeded", []):
        p = content.get("payload") or {}
        if "attempt" not in p:
            continue
        attempt = attempts.get((int(content.get("object_id")), p["attempt"]))
        if attempt is None:
            yield f"{run.chain}: attempt {p['attempt']} of step {content.get('object_id')} is not in the dossier"
            continue
        if money(p.get("cost_usd")) != money(attempt.get("cost_usd")):
            yield _differs(
                content, f"attempt {attempt.get('id')}'s cost_usd", p.get("cost_usd"), attempt.get("cost_usd")
            )
        for tokens in ("input_tokens", "output_tokens"):
            if p.get(tokens) != attempt.get(tokens):
                yield _differs(
                    content, f"attempt {attempt.get('id')}'s {tokens}", p.get(tokens), attempt.get(tokens)
                )
    yield from _run_end_problems(run)


def _run_end_problems(run: _Run) -> Iterator[str]:
    data = run.run
    status = data.get("status")
    if status not in ("succeeded", "failed"):
        return
    ended = run.event(f"run.{status}", data.get("id"))
    if ended is None:
        yield f"{run.chain}: the run is {status} in the dossier, but no event records it"
        return
    p = ended.get("payload") or {}
    if status == "succeeded":
        yield from _hash_differs(
            ended,
            f"run {data.get('id')}'s final answer",
            p.get("final_answer_sha256"),
            data.get("final_answer"),
        )
        if "cost_usd" in p and money(p["cost_usd"]) != money(data.get("cost_usd")):
            yield _differs(ended, f"run {data.get('id')}'s cost_usd", p["cost_usd"], data.get("cost_usd"))
    elif p.get("stop_reason") != data.get("stop_reason"):
        yield _differs(
            ended, f"run {data.get('id')}'s stop_reason", p.get("stop_reason"), data.get("stop_reason")
        )


def task_problems(task: dict[str, Any], runs: list[_Run]) -> Iterator[str]:
    """The task's text and classification against its task.submitted event (in its first run's chain)."""
    if task.get("purged_at"):
        return  # its text is gone, and its submission event with its run chain
    submitted = next(
        (
            r.event("task.submitted", task.get("id"))
            for r in runs
            if r.event("task.submitted", task.get("id"))
        ),
        None,
    )
    if submitted is None:
        return  # a training item's task: its submission is in the global chain, which a bundle does not carry
    p = submitted.get("payload") or {}
    if p.get("classification") != task.get("classification"):
        yield _differs(
            submitted, "the task's classification", p.get("classification"), task.get("classification")
        )
    if "text_sha256" in p and p["text_sha256"] != content_hash(task.get("text")):
        yield _differs(
            submitted, "the task's text (sha256)", p["text_sha256"], content_hash(task.get("text"))
        )


def verify_bundle(bundle: dict[str, Any], key: Ed25519PublicKey) -> list[str]:
    """Every mismatch in the bundle, as sentences (empty: it holds)."""
    if bundle.get("format") != FORMAT:
        return [f"not a dossier bundle of format {FORMAT} (found {bundle.get('format')!r})"]
    runs = [_Run(r) for r in bundle.get("runs") or []]
    problems: list[str] = []
    for run in runs:
        if run.run.get("purge"):
            problems += purge_problems(run, key)  # its content and events are gone by design
            continue
        broken = list(chain_problems(run))
        problems += broken
        problems += checkpoint_problems(run, key)
        problems += seal_problems(run)
        if not broken:  # values are read against events only once the events hold
            problems += value_problems(run)
    problems += task_problems(bundle.get("task") or {}, runs)
    return problems


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
    problems = verify_bundle(bundle, key)
    if problems:
        print(f"NOT INTACT: {len(problems)} mismatch(es)")
        for problem in problems:
            print(f"- {problem}")
        return 1
    runs = bundle.get("runs") or []
    events = sum(len(r.get("events") or []) for r in runs)
    numbers = sorted({(r.get("checkpoint") or {}).get("body", {}).get("number") for r in runs} - {None})
    print(
        f"intact: task {(bundle.get('task') or {}).get('id')}, {len(runs)} run(s), {events} events,"
        f" signed by checkpoint(s) {', '.join(str(n) for n in numbers) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
