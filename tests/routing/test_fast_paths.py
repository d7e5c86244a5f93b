"""The engine's fast paths (one statement per write, on the run as its process last read it) and its
plain paths (a fenced transaction of several statements) leave the same rows and the same chain: the
same run executed each way, compared row by row and event by event, both chains verified."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit import chain as audit_chain
from audit.models import GLOBAL_CHAIN, AuditEvent
from audit.verify import verify
from routing.models import Attempt, Decision, Run, Step
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import program_recursion, run_now, submit

pytestmark = pytest.mark.django_db(transaction=True)

ONE_STATEMENT = "WITH run_as_assumed AS"


def sequence_with_a_retry(server) -> None:
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check", [0]), ("gamma", "Sum up", [1])))],
    )
    server.program(
        "alpha",
        [
            Reply(status=429, headers={"Retry-After": "0"}),
            Reply("draft", prompt_tokens=40, completion_tokens=4),
        ],
    )
    server.program("beta", [Reply("checked", prompt_tokens=70, completion_tokens=7)])
    server.program("gamma", [Reply("42", prompt_tokens=90, completion_tokens=2)])


def side_by_side_then_joined(server) -> None:
    server.program(
        "conductor", [Reply(plan_json(("alpha", "One", []), ("beta", "Two", []), ("gamma", "Both", "all")))]
    )
    server.program("alpha", [Reply("one")])
    server.program("beta", [Reply("two")])
    server.program("gamma", [Reply("one and two")])


def a_step_failing_for_good(server) -> None:
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check", [0])))])
    server.program("alpha", [Reply(status=500)])


@pytest.mark.parametrize(
    "program",
    [sequence_with_a_retry, side_by_side_then_joined, program_recursion, a_step_failing_for_good],
    ids=["a sequence with a retry", "side by side, then joined", "a nested plan", "a step failing for good"],
)
def test_the_fast_and_the_plain_paths_leave_the_same_rows_and_chain(live_pool, settings, program):
    settings.CONDUCTOR_RETRY_BACKOFF_S = 0.01
    server = live_pool["server"]
    program(server)
    run_now(submit("warm up"))  # the global chain's first seal: a later end may seal into it at once
    left: dict[bool, tuple[Run, list[str]]] = {}
    for fast in (True, False):
        settings.CONDUCTOR_ONE_STATEMENT_WRITES = fast
        program(server)
        run = submit("What is 6 * 7?")
        with CaptureQueriesContext(connection) as captured:
            run = run_now(run)
        left[fast] = (run, [q["sql"] for q in captured.captured_queries])

    (fast_run, fast_sql), (plain_run, plain_sql) = left[True], left[False]
    # Each way taken all along: the fast one's writes are single statements, the plain one's none.
    assert sum(s.startswith(ONE_STATEMENT) for s in fast_sql) >= 2
    assert not [s for s in plain_sql if s.startswith(ONE_STATEMENT)]
    assert plain_sql.count("BEGIN") > fast_sql.count("BEGIN")

    in_order = program is not side_by_side_then_joined
    assert snapshot(fast_run, in_order=in_order) == snapshot(plain_run, in_order=in_order)
    for run in (fast_run, plain_run):
        report = verify(chains=[audit_chain.run_chain(run.correlation_id), GLOBAL_CHAIN])
        assert report.intact, report.problems


def snapshot(run: Run, *, in_order: bool = True) -> dict[str, Any]:
    """What a run left, without what differs between any two runs (ids, times, latencies): its row,
    its task's, its decisions, steps and attempts, and its chain's events in order."""
    run.refresh_from_db()
    task = run.task
    names = _names(run)
    steps = Step.objects.filter(run=run).order_by("depth", "decision__attempt", "index")
    return {
        "run": _row(
            run,
            "status",
            "final_answer",
            "score",
            "stop_reason",
            "error",
            "cost_usd",
            "input_tokens",
            "output_tokens",
            "deliveries",
            "claim_epoch",
        ),
        "task": _row(
            task, "status", "final_answer", "score", "error", "cost_usd", "input_tokens", "output_tokens"
        ),
        "decisions": [
            _row(d, "depth", "attempt", "valid", "plan", "error", "raw_output", "policy_checks", "cost_usd")
            for d in Decision.objects.filter(run=run).order_by("depth", "attempt")
        ],
        "steps": [
            _row(
                s,
                "depth",
                "index",
                "status",
                "worker_slug",
                "instruction",
                "response",
                "messages_sent",
                "error",
                "note",
                "cost_usd",
                "input_tokens",
                "output_tokens",
            )
            for s in steps
        ],
        "attempts": [
            {
                "step": names[("step", str(a.step_id))],
                **_row(
                    a, "number", "status", "http_status", "error", "cost_usd", "input_tokens", "output_tokens"
                ),
            }
            for a in Attempt.objects.filter(step__run=run).order_by("step__depth", "step__index", "number")
        ],
        "events": _events(run, names, in_order=in_order),
    }


def _row(obj: Any, *fields: str) -> dict[str, Any]:
    return {name: _named_in_text(getattr(obj, name)) for name in fields}


def _named_in_text(value: Any) -> Any:
    """A note naming a decision by its id ("answered by nested plan (decision 12)"), without the id."""
    return re.sub(r"\(decision \d+\)", "(decision)", value) if isinstance(value, str) else value


def _events(run: Run, names: dict[tuple[str, str], str], *, in_order: bool) -> list[Any]:
    """The run chain's events, in order (`in_order`), or sorted: steps side by side may come back in
    any order."""
    events = AuditEvent.objects.filter(chain=audit_chain.run_chain(run.correlation_id)).order_by("seq")
    shown = [
        (
            e.action,
            e.object_type,
            names.get((e.object_type, e.object_id), e.object_id),
            _without_ids(e.payload, names),
        )
        for e in events
    ]
    return shown if in_order else sorted(shown, key=repr)


def _names(run: Run) -> dict[tuple[str, str], str]:
    """Each of the run's rows (by its type and id as an event names them) by a name that is the same
    in any run of the same plan."""
    names: dict[tuple[str, str], str] = {("run", str(run.pk)): "run", ("task", str(run.task_id)): "task"}
    for d in Decision.objects.filter(run=run):
        names[("decision", str(d.pk))] = f"decision {d.depth}.{d.attempt}"
    for s in Step.objects.filter(run=run).select_related("decision"):
        names[("step", str(s.pk))] = f"step {s.depth}.{s.decision.attempt}.{s.index}"
    for a in Attempt.objects.filter(step__run=run):
        names[("attempt", str(a.pk))] = f"{names[('step', str(a.step_id))]} attempt {a.number}"
    return names


def _without_ids(payload: Any, names: dict[tuple[str, str], str]) -> Any:
    """A payload with its ids named (_names), its latencies left out."""
    steps = {int(pk): name for (kind, pk), name in names.items() if kind == "step"}
    if isinstance(payload, dict):
        kept = {}
        for key, value in payload.items():
            if key == "latency_ms":
                continue
            if key == "run_id":
                value = "run"
            elif key in ("step_id", "final_step_id", "parent_step_id") and value is not None:
                value = steps[int(value)]
            elif key == "sees_steps":
                value = [steps[int(pk)] for pk in value]
            elif key == "sees_step_hashes":
                value = {steps[int(pk)]: digest for pk, digest in value.items()}
            kept[key] = _without_ids(value, names)
        return kept
    if isinstance(payload, list):
        return [_without_ids(item, names) for item in payload]
    return _named_in_text(payload)
