"""How long an evaluation takes, shown as its cost is: before it starts (the preview's estimate) and on
its page and in the API while it runs (the expected duration, what is left, and the items done).

A conductor's time per plan is the mean of its logged plans (the planning time of each of its latest
PLAN_SAMPLE runs' top-level decisions, a retried plan's included); a conductor with none logged yet
takes DEFAULT_PLAN_SECONDS for its kind. An evaluation is items x (the candidate's time per plan + the
baseline's), one run at a time: more workers on the `runs` queue finish it sooner. The workers' own
calls come on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q

from routing.models import RUN_ENDED, ConductorVersion, Decision, Run

from .models import FINISHED, Evaluation, EvaluationRun

SIDES = ("candidate", "baseline")
PLAN_SAMPLE = 200  # the latest runs of a version whose plans give its time per plan
GIVEN = "given"  # the backend a decision records for a plan written elsewhere (routing.engine.plan_record)
# Without a logged plan. An LLM conductor: about 60 s, what the local model (SmolLM2-135M on llama.cpp)
# took a plan on a loaded 2-core CPU; vLLM on a GPU plans in seconds, and the first logged plans
# replace this figure. The learned policy and the static rules plan in milliseconds.
DEFAULT_PLAN_SECONDS: dict[str, float] = {
    ConductorVersion.Backend.LLM: 60.0,
    ConductorVersion.Backend.LEARNED: 0.05,
    ConductorVersion.Backend.STATIC: 0.01,
}


@dataclass(frozen=True)
class PlanTime:
    version: str
    seconds: float
    plans: int  # the logged plans it is the mean of; 0: the default for the kind

    @property
    def basis(self) -> str:
        if self.plans:
            said = f"the mean of its {self.plans:,} logged plan{'' if self.plans == 1 else 's'}"
        else:
            said = "the default for its kind, no plan of it logged yet"
        return f"{self.version}: {duration_text(self.seconds)} a plan ({said})"


def plan_time(version: ConductorVersion) -> PlanTime:
    """`version`'s time per plan: its latest logged plans' mean, else the default for its kind."""
    latest = (
        Run.objects.filter(conductor_version=version, status__in=RUN_ENDED, plan_override="")
        .order_by("-id")
        .values("id")[:PLAN_SAMPLE]
    )
    per_run: dict[int, float] = {}
    rows = Decision.objects.filter(run__in=latest, depth=0).exclude(backend=GIVEN)
    for run_id, latency_ms in rows.values_list("run_id", "latency_ms"):
        per_run[run_id] = per_run.get(run_id, 0.0) + (latency_ms or 0.0)
    if per_run:
        return PlanTime(version.name, sum(per_run.values()) / len(per_run) / 1000, len(per_run))
    default = DEFAULT_PLAN_SECONDS.get(version.backend, DEFAULT_PLAN_SECONDS[ConductorVersion.Backend.LLM])
    return PlanTime(version.name, default, 0)


def duration_text(seconds: float) -> str:
    """About how long, as a person says it: 'under a second', '45 s', '12 min', '1 h 20 min'."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"{round(seconds)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@dataclass(frozen=True)
class Duration:
    """About how long `items` items take on each side, and (while it runs) what is left."""

    items: int
    sides: list[PlanTime]
    remaining_seconds: float | None = None

    @property
    def seconds(self) -> float:
        return self.items * sum(side.seconds for side in self.sides)

    @property
    def basis(self) -> str:
        return f"{self.items:,} items x the time per plan of " + "; ".join(s.basis for s in self.sides)

    @property
    def message(self) -> str:
        left = (
            "" if self.remaining_seconds is None else f"; about {duration_text(self.remaining_seconds)} left"
        )
        return f"It should take about {duration_text(self.seconds)}, one run at a time ({self.basis}){left}."

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "remaining_seconds": None if self.remaining_seconds is None else round(self.remaining_seconds, 1),
            "per_plan": [
                {"version": s.version, "seconds": round(s.seconds, 3), "logged_plans": s.plans}
                for s in self.sides
            ],
            "basis": self.basis,
            "message": self.message,
        }


def evaluation_duration_estimate(
    candidate: ConductorVersion, baseline: ConductorVersion, items: int
) -> Duration:
    """Before it starts: `items` items planned by the candidate and by the baseline."""
    return Duration(items=items, sides=[plan_time(candidate), plan_time(baseline)])


@dataclass(frozen=True)
class Progress:
    items_done: int  # items whose runs on both sides have ended
    items: int
    runs_done: int
    runs: int
    ended: dict[str, int]  # runs ended, per side

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if k != "ended"}


def evaluation_progress(evaluation: Evaluation) -> Progress:
    """Items done (both sides' runs ended) of all, and runs done of all, per side too: one query."""

    def ended(side: str) -> Count:
        return Count("id", filter=Q(side=side, run__status__in=RUN_ENDED))

    rows = list(
        EvaluationRun.objects.filter(evaluation=evaluation)
        .values("item")
        .annotate(runs=Count("id"), candidate=ended("candidate"), baseline=ended("baseline"))
    )
    per_side = {
        "candidate": sum(row["candidate"] for row in rows),
        "baseline": sum(row["baseline"] for row in rows),
    }
    return Progress(
        items_done=sum(row["candidate"] + row["baseline"] == row["runs"] for row in rows),
        items=len(rows),
        runs_done=sum(per_side.values()),
        runs=sum(row["runs"] for row in rows),
        ended=per_side,
    )


def evaluation_duration(evaluation: Evaluation, progress: Progress) -> Duration:
    """An evaluation's expected duration, at what its conductors' plans take now (its own ended runs
    count among their logged plans), and while it runs, what is left: each side's runs still to end at
    that side's time per plan."""
    sides = dict(zip(SIDES, (plan_time(evaluation.candidate), plan_time(evaluation.baseline)), strict=True))
    items = len(evaluation.items) or progress.items
    left = None
    if evaluation.status not in FINISHED:
        left = sum(max(0, items - progress.ended[side]) * plan.seconds for side, plan in sides.items())
    return Duration(items=items, sides=list(sides.values()), remaining_seconds=left)
