"""The values of a dossier bundle, field by field, against the events that recorded them (no Django,
no database): a run's decisions, steps, attempts, kind, conductor, status, answer, score and cost, and
the task's text, classification, status, answer, score, cost and purge against its runs'. Read only
once a run's chain holds (audit.bundle_proof); audit.bundle runs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from .bundle_proof import ENDED, RUN, Run
from .proof import content_hash, money

CONDUCTOR = "conductor"  # a step given back to the conductor: answered without a call of its own
OWN = ("live", "retry")  # the runs that answer for their task
STEP_EVENTS = {"step.succeeded": "succeeded", "step.failed": "failed", "step.skipped": "skipped"}


def _differs(content: dict[str, Any], what: str, recorded: Any, shown: Any) -> str:
    return (
        f"{content.get('chain')} seq {content.get('seq')}: {what} is {shown!r} in the dossier; "
        f"its {content.get('action')} event recorded {recorded!r}"
    )


def _hash_differs(content: dict[str, Any], what: str, recorded: Any, shown: Any) -> Iterator[str]:
    """A value the event recorded by its sha256, against the value the dossier shows."""
    if recorded != content_hash(shown):
        yield _differs(content, f"{what} (sha256)", recorded, content_hash(shown))


def value_problems(run: Run) -> Iterator[str]:
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


def _step_problems(run: Run, plans: dict[str, dict[str, Any]]) -> Iterator[str]:
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


def _attempt_problems(run: Run) -> Iterator[str]:
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


def _run_problems(run: Run) -> Iterator[str]:
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


def run_kinds(runs: list[Run]) -> dict[str, tuple[str, dict[str, Any]]]:
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


def task_problems(task: dict[str, Any], runs: list[Run]) -> Iterator[str]:
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
    kinds = run_kinds(runs)
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
    own = sorted((r for r in runs if r.run.get("kind") in OWN), key=lambda r: id_order(r.id))
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
    task: dict[str, Any], runs: list[Run], submitted: dict[str, Any] | None
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


def id_order(value: Any) -> tuple[int, str]:
    try:
        return int(value), ""
    except (TypeError, ValueError):
        return 0, str(value)
