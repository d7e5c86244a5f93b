"""Runs side by side: the read model of the compare page and its API.

Two to MAX_RUNS runs (a live run and its retry, a shadow run beside its live run, an evaluation's two
runs of one item) as rows of aligned cells, one cell per run: the conductor, the outcome, the plan
(its thought, then each step by its position in the plan, nested steps under the step that asked for
them), every step's answer, and what the run cost and took. A row whose cells are not all equal
`differs`. `compare_runs` builds the comparison from runs as loaded by `runs_for_compare`; it reads
nothing else, so that it can be tested on any runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.http import QueryDict
from django.urls import reverse

from routing import selectors
from routing.models import Decision, Run, Step
from utilities import params

MIN_RUNS = 2
MAX_RUNS = 4
RUN_PARAM = "run"
LARGEST_ID = 2**63 - 1  # a bigint primary key

# How a row's cells are shown (the page's template and API readers go by it).
TEXT = "text"  # short untrusted text: a worker, a stop reason
LONG_TEXT = "long_text"  # untrusted text shown as a block: a thought, an instruction, an answer
MONEY = "money"  # USD, a Decimal
SECONDS = "seconds"
MILLISECONDS = "milliseconds"
COUNT = "count"
SCORE = "score"
KINDS = (TEXT, LONG_TEXT, MONEY, SECONDS, MILLISECONDS, COUNT, SCORE)


@dataclass(frozen=True)
class Row:
    field: str
    label: str
    kind: str
    values: tuple[Any, ...]  # one per run; None where the run has no such value (a step it lacks)

    @property
    def differs(self) -> bool:
        return len(set(self.values)) > 1

    @property
    def numeric(self) -> bool:
        return self.kind not in (TEXT, LONG_TEXT)


@dataclass(frozen=True)
class Section:
    key: str  # "run", "plan", "step-0", "step-1.0"
    title: str
    rows: tuple[Row, ...]

    @property
    def differs(self) -> bool:
        return any(row.differs for row in self.rows)


@dataclass(frozen=True)
class ComparedRun:
    id: int
    task_id: Any
    kind: str
    kind_label: str


@dataclass(frozen=True)
class Comparison:
    runs: tuple[ComparedRun, ...]
    sections: tuple[Section, ...]

    @property
    def rows(self) -> int:
        return sum(len(s.rows) for s in self.sections)

    @property
    def differing(self) -> int:
        return sum(1 for s in self.sections for row in s.rows if row.differs)


class RunChoiceError(params.InvalidParameter):
    """The runs asked for cannot be compared as given (a 400 that names the `run` parameter)."""

    def __init__(self, message: str):
        super().__init__(RUN_PARAM, message)


# --- Which runs ----------------------------------------------------------------------------------


def run_ids(query: QueryDict) -> list[int]:
    """The run ids of `?run=12&run=15`, in the order given; each a whole number, none twice, at most
    MAX_RUNS (none at all is an empty list: the caller says what that means)."""
    given = [value for value in query.getlist(RUN_PARAM) if value.strip()]  # a form's empty boxes
    if len(given) > MAX_RUNS:
        raise RunChoiceError(f"at most {MAX_RUNS} runs are compared at once; {len(given)} were given")
    ids: list[int] = []
    for value in given:
        number = params.integer({RUN_PARAM: value}, RUN_PARAM, minimum=1, maximum=LARGEST_ID)
        assert number is not None  # the value is not blank
        if number in ids:
            raise RunChoiceError(f"run {number} is given twice")
        ids.append(number)
    return ids


def runs_for_compare(ids: Sequence[int]) -> list[Run]:
    """The runs `ids` names, in that order, with their decisions, steps and tasks; refused with a
    reason unless there are MIN_RUNS to MAX_RUNS and every id is a run's."""
    if not MIN_RUNS <= len(ids) <= MAX_RUNS:
        raise RunChoiceError(f"give {MIN_RUNS} to {MAX_RUNS} run ids to compare, as ?run=12&run=15")
    found = {run.pk: run for run in selectors.run_detail_queryset().filter(pk__in=ids)}
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise RunChoiceError(f"no run has the id {', '.join(missing)}")
    return [found[i] for i in ids]


def compare_link(runs: Sequence[Run]) -> str | None:
    """The compare page of `runs` (the first MAX_RUNS, oldest first), or None for fewer than two."""
    chosen = sorted(runs, key=lambda r: (r.created_at, r.pk))[:MAX_RUNS]
    if len(chosen) < MIN_RUNS:
        return None
    return f"{reverse('routing:run-compare')}?{urlencode([(RUN_PARAM, r.pk) for r in chosen])}"


# --- The comparison ------------------------------------------------------------------------------


def compare_runs(runs: Sequence[Run]) -> Comparison:
    """`runs` aligned row by row (see the module's docstring)."""
    plans = [_plan_of(run) for run in runs]
    positions = sorted({p for steps in plans for p in steps}, key=_position_order)
    sections = (
        Section("run", "Run", _run_rows(runs)),
        Section("plan", "Plan", _plan_rows(runs)),
        *(_step_section(position, [steps.get(position) for steps in plans]) for position in positions),
    )
    return Comparison(
        runs=tuple(ComparedRun(r.pk, r.task_id, r.kind, r.get_kind_display()) for r in runs),
        sections=sections,
    )


def _row(field: str, label: str, kind: str, values: Sequence[Any]) -> Row:
    return Row(field, label, kind, tuple(values))


def _run_rows(runs: Sequence[Run]) -> tuple[Row, ...]:
    def seconds(value: float | None) -> float | None:
        return None if value is None else round(value, 2)  # as the pages show it

    return (
        _row("task", "Task", TEXT, [str(r.task_id)[:8] for r in runs]),
        _row("item", "Recorded item", TEXT, [r.task.source_item for r in runs]),
        _row("kind", "Kind", TEXT, [r.get_kind_display() for r in runs]),
        _row("conductor", "Conductor version", TEXT, [r.conductor_version.name for r in runs]),
        _row("backend", "Backend", TEXT, [r.conductor_version.get_backend_display() for r in runs]),
        _row("status", "Status", TEXT, [r.get_status_display() for r in runs]),
        _row("stop_reason", "Stopped", TEXT, [r.stop_reason for r in runs]),
        _row("error", "Error", LONG_TEXT, [r.error for r in runs]),
        _row("final_answer", "Final answer", LONG_TEXT, [r.final_answer for r in runs]),
        _row("score", "Score", SCORE, [r.score for r in runs]),
        _row("cost_usd", "Cost (USD)", MONEY, [r.cost_usd for r in runs]),
        _row("queued_s", "Queued (s)", SECONDS, [seconds(r.queued_s) for r in runs]),
        _row("ran_s", "Ran (s)", SECONDS, [seconds(r.ran_s) for r in runs]),
        _row("input_tokens", "Tokens in", COUNT, [r.input_tokens for r in runs]),
        _row("output_tokens", "Tokens out", COUNT, [r.output_tokens for r in runs]),
    )


def _top_decision(run: Run) -> Decision | None:
    """The plan the run executed (its valid top-level decision), else its last top-level try."""
    top = [d for d in run.decisions.all() if d.depth == 0]
    valid = [d for d in top if d.valid]
    return (valid or top or [None])[-1]


def _plan_rows(runs: Sequence[Run]) -> tuple[Row, ...]:
    decisions = [_top_decision(run) for run in runs]

    def thought(d: Decision | None) -> str | None:
        if d is None:
            return None
        if d.valid:
            return str((d.plan or {}).get("thought") or "")
        return f"Invalid plan: {d.error}"

    def plan_ms(run: Run) -> float:
        return round(sum(d.latency_ms for d in run.decisions.all() if d.depth == 0), 3)

    return (
        _row("thought", "Thought", LONG_TEXT, [thought(d) for d in decisions]),
        _row("steps", "Steps", COUNT, [len(run.steps.all()) for run in runs]),
        _row("plan_ms", "Planning (ms)", MILLISECONDS, [plan_ms(run) for run in runs]),
        _row("plan_cost_usd", "Planning cost (USD)", MONEY, [_plan_cost(run) for run in runs]),
    )


def _plan_cost(run: Run) -> Decimal:
    return sum((d.cost_usd for d in run.decisions.all()), Decimal(0))


def _plan_of(run: Run) -> dict[str, Step]:
    """The run's steps by their position: "0", "1" for the plan's own; "1.0" for the first step of
    the plan step 1 wrote (a step given to the conductor), and so on down."""
    steps = {s.pk: s for s in run.steps.all()}
    parents = {d.pk: d.parent_step_id for d in run.decisions.all()}

    def position(step: Step) -> str:
        parent = parents.get(step.decision_id)
        if parent is None or parent not in steps:
            return str(step.index)
        return f"{position(steps[parent])}.{step.index}"

    return {position(s): s for s in steps.values()}


def _position_order(position: str) -> tuple[int, ...]:
    return tuple(int(part) for part in position.split("."))


def _step_section(position: str, steps: Sequence[Step | None]) -> Section:
    def each(read) -> list[Any]:
        return [None if s is None else read(s) for s in steps]

    def sees(step: Step) -> str:
        if step.access == "all":
            return "all earlier"
        return ", ".join(str(i) for i in step.access) if step.access else "nothing"

    rows = (
        _row("worker", "Worker", TEXT, each(lambda s: s.worker_slug)),
        _row("instruction", "Instruction", LONG_TEXT, each(lambda s: s.instruction)),
        _row("sees", "Sees", TEXT, each(sees)),
        _row("status", "Status", TEXT, each(lambda s: s.get_status_display())),
        _row("answer", "Answer", LONG_TEXT, each(_answer)),
        _row("cost_usd", "Cost (USD)", MONEY, each(lambda s: s.cost_usd)),
        _row("latency_ms", "Latency (ms)", MILLISECONDS, each(lambda s: s.latency_ms)),
    )
    return Section(f"step-{position}", f"Step {position}", rows)


def _answer(step: Step) -> str:
    return step.response or (f"Error: {step.error}" if step.error else "")
