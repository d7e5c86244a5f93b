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
The proof of each run is in audit.bundle_proof and the value checks in audit.bundle_values; like
this module, they import no Django.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from . import note
from .bundle_proof import (
    ENDED,
    Run,
    chain_problems,
    checkpoint_problems,
    load_public_key,
    log_problems,
    purge_problems,
    seal_problems,
    tree_head_number,
)
from .bundle_values import OWN, id_order, run_kinds, task_problems, value_problems

FORMAT = "conductor-web/dossier-bundle/1"


def unproven(bundle: dict[str, Any], runs: list[Run]) -> list[str]:
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
    kinds = run_kinds(runs)
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
    runs = [Run(r) for r in bundle.get("runs") or []]
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
                numbers.add(tree_head_number(note.tree_head(note.split(signed)[0])))
            except note.NoteError:
                continue
        elif (run.get("checkpoint") or {}).get("body", {}).get("number") is not None:
            numbers.add(str(run["checkpoint"]["body"]["number"]))
    return sorted((n for n in numbers if n is not None), key=id_order)


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
