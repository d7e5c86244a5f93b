"""The task rows against the events that describe them (registered with the audit verifier beside the
runs' check, governance.run_rows).

What the task page and the dossier show as fact about a task is bound to an event:
- its text (sha256), classification and budgets to its `task.submitted` event;
- its totals to its runs' (each run's bound to its own chain), its answer and score to its own runs'
  (the live run's, or the retry's that answered after it);
- its rows of the exposure map (a rollup) to the vendors its steps and judges reached;
- its reviewers' verdicts (review.annotations.services) to their `annotation.added` events: verdict, label, run,
  step, the comment's hash (a purge deletes comments) and the author (the event's actor), and every
  recorded verdict to its row;
- a purge (`purged_at`, after which its content is gone) to a `task.purged` event of the global chain
  and a signed ChainPurge for each of its run chains, and what the purge kept (who was called, at what
  vendor, for what cost) to what that event recorded.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal

from audit.actions import Action
from audit.chain import run_chain
from audit.models import GLOBAL_CHAIN, AuditEvent, ChainPurge
from audit.verify import Problem
from governance.retention import PURGED, kept_after_purge
from governance.run_rows import differs
from routing.hashing import content_hash
from routing.models import Annotation, PendingRollup, Run, RunStatus, Step, StepStatus, Task, TaskExposure

BATCH = 200  # tasks per round trip in a full verification
OWN = (Run.Kind.LIVE, Run.Kind.RETRY)  # the runs that answer for their task
KEPT = {"runs": "run", "steps": "step", "attempts": "attempt"}


def _task_problem(task: Task, detail: str, chain: str = GLOBAL_CHAIN) -> Problem:
    return Problem("row", None, chain, None, f"task {task.pk}: {detail}")


def _submission_problems(task: Task, event: AuditEvent | None, chain: str) -> Iterator[Problem]:
    if event is None:
        yield _task_problem(task, "no task.submitted event records it", chain)
        return
    p = event.payload
    if p.get("classification") != task.classification:
        yield differs(event, f"task {task.pk}'s classification", p.get("classification"), task.classification)
    if "text_sha256" in p and p["text_sha256"] != content_hash(task.text):
        yield differs(event, f"task {task.pk}'s text (sha256)", p["text_sha256"], content_hash(task.text))
    budgets = p.get("budgets") or {}
    for name in ("max_steps", "max_depth"):
        if name in budgets and budgets[name] != getattr(task, name):
            yield differs(event, f"task {task.pk}'s {name}", budgets[name], getattr(task, name))
    if budgets.get("max_usd") is not None and Decimal(str(budgets["max_usd"])) != task.max_usd:
        yield differs(event, f"task {task.pk}'s max_usd", budgets["max_usd"], str(task.max_usd))


def _totals_problems(task: Task, runs: list[Run], chain: str) -> Iterator[Problem]:
    """Totals are the sum of the runs' (once none is going: a run adds to its task's when it ends);
    answer and score those of the last own run that succeeded."""
    going = any(r.status not in (RunStatus.SUCCEEDED, RunStatus.FAILED) for r in runs)
    for name in () if going else ("cost_usd", "input_tokens", "output_tokens"):
        total = sum((getattr(r, name) for r in runs), Decimal(0) if name == "cost_usd" else 0)
        if total != getattr(task, name):
            yield _task_problem(
                task, f"its {name} is {getattr(task, name)} in its row, but its runs add up to {total}", chain
            )
    answered = [r for r in runs if r.kind in OWN and r.status == RunStatus.SUCCEEDED and r.finished_at]
    last = max(answered, key=lambda r: r.finished_at, default=None)
    answer, score = (last.final_answer, last.score) if last is not None else ("", None)
    if content_hash(task.final_answer) != content_hash(answer):
        yield _task_problem(
            task,
            f"its final answer (sha256 {content_hash(task.final_answer)[:12]}) is not its answering run's"
            f" (sha256 {content_hash(answer)[:12]})",
            chain,
        )
    if last is not None and task.score != score:
        yield _task_problem(
            task, f"its score is {task.score!r} in its row, but its answering run's is {score!r}", chain
        )


def _purge_problems(
    task: Task, runs: list[Run], event: AuditEvent | None, purged: set[str]
) -> Iterator[Problem]:
    """A purge is honoured with its event and a signed purge of each run chain (the chain verifier
    checks each ChainPurge's signature), and what it kept is what its event recorded."""
    if event is None:
        yield _task_problem(
            task,
            f"purged_at is set ({task.purged_at:%Y-%m-%d %H:%M}), but no task.purged event records a purge",
        )
        return
    unpurged = [r for r in runs if run_chain(r.correlation_id) not in purged]
    if unpurged:
        yield differs(
            event,
            f"task {task.pk}'s purge",
            "every run chain purged",
            f"no signed purge of {', '.join(run_chain(r.correlation_id) for r in unpurged)}",
        )
    recorded = event.payload.get("kept")
    if recorded is None:
        return  # a purge made before purges recorded what they kept
    now = kept_after_purge(task.pk)
    for table, noun in KEPT.items():
        was = {row[0]: row for row in recorded.get(table, [])}
        is_ = {row[0]: row for row in now.get(table, [])}
        for pk in sorted(was.keys() | is_.keys()):
            if was.get(pk) != is_.get(pk):
                yield differs(event, f"{noun} {pk} (kept after the purge)", was.get(pk), is_.get(pk))


def _exposure_problems(
    task: Task, runs: list[Run], reached: set[str], exposed: dict[str, str], pending: bool, chain: str
) -> Iterator[Problem]:
    """The exposure map's rows for the task (a rollup) against the vendors its steps and judges reached
    (each bound to its event): a vendor it names that nothing reached, a class other than the task's,
    and, once every run is in the rollups, a vendor reached that it leaves out."""
    for vendor, classification in sorted(exposed.items()):
        if vendor not in reached:
            yield _task_problem(
                task,
                f"the exposure map says vendor {vendor!r} saw it; no step or judge of its runs reached {vendor!r}",
                chain,
            )
        elif classification != task.classification:
            yield _task_problem(
                task,
                f"the exposure map records it as {classification!r} at {vendor!r}; it is {task.classification!r}",
                chain,
            )
    finished = all(r.status in (RunStatus.SUCCEEDED, RunStatus.FAILED) for r in runs)
    if finished and not pending:
        for vendor in sorted(reached - exposed.keys()):
            yield _task_problem(
                task,
                f"vendor {vendor!r} saw it (its steps' events say so), but the exposure map leaves {vendor!r} out",
                chain,
            )


def _review_problems(
    task: Task, annotations: list[Annotation], recorded: list[AuditEvent]
) -> Iterator[Problem]:
    rows = {str(a.pk): a for a in annotations}
    for event in recorded:
        annotation = rows.pop(event.object_id, None)
        if annotation is None:
            yield Problem("row", event.pk, event.chain, event.seq, f"annotation {event.object_id} is gone")
            continue
        p = event.payload
        shown = {
            "verdict": annotation.verdict,
            "label": annotation.label,
            "run_id": annotation.run_id,
            "step_id": annotation.step_id,
        }
        for name, value in shown.items():
            if p.get(name) != value:
                yield differs(event, f"annotation {annotation.pk}'s {name}", p.get(name), value)
        # Its author is who wrote the event (author_name copies the actor's name; an account deleted
        # leaves author empty).
        if annotation.author_name != event.actor_name:
            yield differs(
                event, f"annotation {annotation.pk}'s author_name", event.actor_name, annotation.author_name
            )
        if annotation.author_id is not None and str(annotation.author_id) != event.actor_id:
            yield differs(
                event,
                f"annotation {annotation.pk}'s author (user id)",
                event.actor_id,
                str(annotation.author_id),
            )
        comment = hashlib.sha256(annotation.comment.encode()).hexdigest()
        if p.get("comment_sha256") != comment and not (task.purged_at and annotation.comment == PURGED):
            yield differs(
                event, f"annotation {annotation.pk}'s comment (sha256)", p.get("comment_sha256"), comment
            )
    for pk in rows:
        yield _task_problem(task, f"annotation {pk}: no annotation.added event records it")


def _check(tasks: list[Task]) -> Iterator[Problem]:
    ids = [t.pk for t in tasks]
    runs: dict[uuid.UUID, list[Run]] = defaultdict(list)
    for run in Run.objects.filter(task_id__in=ids).order_by("pk"):
        runs[run.task_id].append(run)
    reached: dict[uuid.UUID, set[str]] = defaultdict(set)
    for task_id, vendor in (
        Step.objects.filter(run__task_id__in=ids, started_at__isnull=False)
        .exclude(status=StepStatus.PENDING)
        .exclude(vendor="")
        .values_list("run__task_id", "vendor")
    ):
        reached[task_id].add(vendor)
    by_chain = {run_chain(r.correlation_id): r.task_id for rs in runs.values() for r in rs}
    for name, payload in AuditEvent.objects.filter(
        chain__in=list(by_chain), action=Action.SCORE_JUDGED
    ).values_list("chain", "payload"):
        if payload.get("vendor") and (payload.get("input_tokens") or 0) > 0:
            reached[by_chain[name]].add(payload["vendor"])
    exposed: dict[uuid.UUID, dict[str, str]] = defaultdict(dict)
    for task_id, vendor, classification in TaskExposure.objects.filter(task_id__in=ids).values_list(
        "task_id", "vendor", "classification"
    ):
        exposed[task_id][vendor] = classification
    pending = set(
        Run.objects.filter(task_id__in=ids, pk__in=PendingRollup.objects.values("run_id")).values_list(
            "task_id", flat=True
        )
    )
    events: dict[tuple[str, str], AuditEvent] = {}
    for event in AuditEvent.objects.filter(
        object_type="task",
        object_id__in=[str(i) for i in ids],
        action__in=[Action.TASK_SUBMITTED, Action.TASK_PURGED],
    ).order_by("id"):
        events.setdefault((event.action, event.object_id), event)
    annotations: dict[uuid.UUID, list[Annotation]] = defaultdict(list)
    for annotation in Annotation.objects.filter(run__task_id__in=ids).select_related("run").order_by("pk"):
        annotations[annotation.run.task_id].append(annotation)
    reviewed: dict[uuid.UUID, list[AuditEvent]] = defaultdict(list)
    for event in AuditEvent.objects.filter(task_id__in=ids, action=Action.ANNOTATION_ADDED).order_by("id"):
        reviewed[event.task_id].append(event)
    chains = [run_chain(r.correlation_id) for rs in runs.values() for r in rs]
    purged = set(ChainPurge.objects.filter(chain__in=chains).values_list("chain", flat=True))
    for task in tasks:
        own = [r for r in runs[task.pk] if r.kind in OWN]
        chain = run_chain(own[0].correlation_id) if own else GLOBAL_CHAIN
        submitted = events.get((Action.TASK_SUBMITTED, str(task.pk)))
        yield from _review_problems(task, annotations[task.pk], reviewed[task.pk])
        if task.purged_at is not None:
            yield from _purge_problems(
                task, runs[task.pk], events.get((Action.TASK_PURGED, str(task.pk))), purged
            )
            continue
        yield from _submission_problems(task, submitted, chain)
        yield from _totals_problems(task, runs[task.pk], chain)
        yield from _exposure_problems(
            task, runs[task.pk], reached[task.pk], exposed[task.pk], task.pk in pending, chain
        )


def task_rows_problems(chains: list[str] | None) -> Iterator[Problem]:
    """The registered task check: the tasks of these run chains (None: every task), in batches."""
    tasks = Task.objects.order_by("pk")
    if chains is not None:
        ids = []
        for name in chains:
            try:
                ids.append(uuid.UUID(name.removeprefix("run:")))
            except ValueError:
                continue
        tasks = tasks.filter(runs__correlation_id__in=ids).distinct()
    last = None
    while True:
        page = tasks.filter(pk__gt=last) if last is not None else tasks
        batch = list(page[:BATCH])
        if not batch:
            return
        last = batch[-1].pk
        yield from _check(batch)
