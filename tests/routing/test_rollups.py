"""The rollups the aggregate pages read: kept as real runs finish (folded off the run's path, and
before every read), equal to a recount from the rows, each task counted once per vendor, runs in
flight added from their rows."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone as dj_timezone

from audit.actions import Action
from audit.models import AuditEvent
from compliance import dossiers
from routing import engine, folds, replay
from routing.models import (
    Grain,
    PendingRollup,
    Run,
    RunRollup,
    RunStatus,
    Step,
    StepStatus,
    Task,
    TaskExposure,
    UsageRollup,
)
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply
from tests.training.test_judge_and_regex import judge_worker, judged_run  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _snapshot() -> dict[str, list[tuple]]:
    return {
        model.__name__: sorted(tuple(str(v) for v in row) for row in model.objects.values_list(*fields))
        for model, fields in (
            (
                UsageRollup,
                (
                    "grain",
                    "start",
                    "source",
                    "run_kind",
                    "conductor",
                    "worker_slug",
                    "vendor",
                    "classification",
                    "domain",
                    "calls",
                    "new_tasks",
                    "input_tokens",
                    "output_tokens",
                    "cost_usd",
                ),
            ),
            (
                RunRollup,
                (
                    "grain",
                    "start",
                    "run_kind",
                    "conductor",
                    "classification",
                    "domain",
                    "final_worker",
                    "status",
                    "runs",
                    "cost_usd",
                    "scored",
                    "score_sum",
                    "scored_cost_usd",
                ),
            ),
            (TaskExposure, ("task_id", "vendor", "classification", "task_created_at", "first_at", "last_at")),
        )
    }


@pytest.fixture
def history(judge_worker):  # noqa: F811 - the fixture imported above
    """Real runs: replay tasks of two domains, one run again (a retry), one graded by an LLM judge."""
    items = replay.read_items(replay.split_path("dev"))
    chosen = [i for i in items if i.domain == "gsm8k"][:2] + [i for i in items if i.domain == "math-l5"][:2]
    tasks = []
    for item in chosen:
        task, _ = task_submit(
            submission=TaskSubmission(
                text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
            ),
            source=Task.Source.CLI,
        )
        engine.execute_run(task.runs.get().pk)
        tasks.append(task)
    first = tasks[0].runs.get()
    retry = Run.objects.create(task=tasks[0], conductor_version=first.conductor_version, kind=Run.Kind.RETRY)
    engine.execute_run(retry.pk)
    judge_worker.program("grader", [Reply("CORRECT", prompt_tokens=300, completion_tokens=2)])
    judged = judged_run()
    return {"tasks": tasks, "retry": retry, "judged": judged}


def test_rollups_kept_as_runs_finish_equal_a_recount_and_the_rows(history):
    folds.fold()  # whatever this process folded already as the runs ended
    assert not PendingRollup.objects.exists()
    kept = _snapshot()
    assert kept["UsageRollup"] and kept["RunRollup"] and kept["TaskExposure"]
    counts = folds.rebuild()
    assert _snapshot() == kept
    assert counts["RunRollup"] == RunRollup.objects.count()

    # ... and each grain's sums are the rows'.
    started = Step.objects.exclude(status=StepStatus.PENDING).filter(started_at__isnull=False)
    pairs = {(s.run.task_id, s.vendor) for s in started.exclude(vendor="").select_related("run")}
    pairs.add((history["judged"].task_id, "acme"))
    event = AuditEvent.objects.get(action=Action.SCORE_JUDGED)
    for grain in Grain:
        usage = UsageRollup.objects.filter(grain=grain)
        steps = usage.filter(source=UsageRollup.Source.STEP).aggregate(
            calls=Sum("calls"), cost=Sum("cost_usd"), tokens=Sum("input_tokens")
        )
        assert steps["calls"] == started.count() > 0
        assert steps["cost"] == started.aggregate(c=Sum("cost_usd"))["c"]
        assert steps["tokens"] == started.aggregate(t=Sum("input_tokens"))["t"]
        runs = RunRollup.objects.filter(grain=grain).aggregate(
            runs=Sum("runs"), cost=Sum("cost_usd"), scored=Sum("scored")
        )
        assert runs["runs"] == Run.objects.count() == 6
        assert runs["cost"] == Run.objects.aggregate(c=Sum("cost_usd"))["c"]
        assert runs["scored"] == Run.objects.filter(score__isnull=False).count()
        # The judge's call is a call to its vendor, with the cost the event recorded.
        judge = usage.get(source=UsageRollup.Source.JUDGE)
        assert (judge.vendor, judge.calls, judge.new_tasks) == ("acme", 1, 1)
        assert judge.cost_usd == Decimal(str(event.payload["cost_usd"])) > 0
        # Each task counted once per vendor, however many runs and steps reached it.
        assert usage.aggregate(n=Sum("new_tasks"))["n"] == len(pairs)
    assert set(TaskExposure.objects.values_list("task_id", "vendor")) == pairs


def test_a_window_reads_whole_days_from_daily_rows_and_its_ends_from_hourly_ones(history):
    """The same sums whichever rows a window reads; a window of days reads daily rows."""
    now = dj_timezone.now()
    for since, until in (
        (None, None),
        (now - timedelta(days=3, hours=5), now + timedelta(hours=2)),
        (now - timedelta(hours=2), now + timedelta(minutes=1)),
        (None, now + timedelta(days=2)),
        (now - timedelta(days=9), None),
    ):
        rows = folds.window(UsageRollup.objects.all(), since, until)
        hourly = folds.window(UsageRollup.objects.all(), since, until, days=False)
        assert rows.aggregate(n=Sum("calls"))["n"] == hourly.aggregate(n=Sum("calls"))["n"] > 0, (
            since,
            until,
        )
    long = folds.window(UsageRollup.objects.all(), now - timedelta(days=3, hours=5), now + timedelta(days=1))
    assert long.filter(grain=Grain.DAY).exists()
    # A window that ended before it all: nothing, by either grain.
    assert not folds.window(UsageRollup.objects.all(), None, now - timedelta(days=1)).exists()


def test_a_task_sent_twice_to_a_vendor_counts_once_and_a_run_in_flight_counts_from_its_rows(history):
    task = history["tasks"][0]
    vendor = task.runs.get(kind=Run.Kind.LIVE).steps.exclude(vendor="").first().vendor
    (row,) = [r for r in dossiers.vendor_exposure(since=None, until=None) if r["vendor"] == vendor]
    steps_to_vendor = Step.objects.filter(vendor=vendor, started_at__isnull=False).count()
    tasks_to_vendor = Step.objects.filter(vendor=vendor).values("run__task").distinct().count()
    assert row["steps"] == steps_to_vendor and row["tasks"] == tasks_to_vendor  # the retry did not add a task

    # A run in flight: a step of it has reached a new vendor; it is on the report before the run ends,
    # and its task (already counted for `vendor`) is not counted twice.
    live = task.runs.get(kind=Run.Kind.LIVE)
    flight = Run.objects.create(
        task=task, conductor_version=live.conductor_version, kind=Run.Kind.RETRY, status=RunStatus.RUNNING
    )
    done = live.steps.exclude(vendor="").first()
    now = dj_timezone.now()
    for slug, to in (("far-away", "initech"), (done.worker_slug, vendor)):
        Step.objects.create(
            run=flight,
            decision=done.decision,
            index=100 + len(to),
            worker_slug=slug,
            vendor=to,
            instruction="x",
            status=StepStatus.RUNNING,
            started_at=now,
            cost_usd=Decimal("0.5"),
        )
    rows = {r["vendor"]: r for r in dossiers.vendor_exposure(since=None, until=None)}
    assert (rows["initech"]["steps"], rows["initech"]["tasks"]) == (1, 1)
    assert rows["initech"]["cost"] == Decimal("0.5")
    assert (rows[vendor]["steps"], rows[vendor]["tasks"]) == (steps_to_vendor + 1, tasks_to_vendor)
    listed = dossiers.vendor_tasks(
        vendor="initech", classification=task.classification, since=None, until=None
    )
    assert listed == [task]
    # A period that ended before it all: nothing.
    assert dossiers.vendor_exposure(since=None, until=now - timedelta(days=1)) == []
    assert (
        dossiers.vendor_tasks(
            vendor=vendor, classification=task.classification, since=None, until=now - timedelta(days=1)
        )
        == []
    )


def test_windows_are_whole_utc_hours():
    india = timezone(timedelta(hours=5, minutes=30))
    since = datetime(2026, 5, 1, 10, 10, tzinfo=india)  # 04:40 UTC
    until = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert (folds.hour_floor(since), folds.hour_ceil(until)) == (
        datetime(2026, 5, 1, 4, tzinfo=UTC),
        until,
    )
    assert folds.hour_ceil(datetime(2026, 5, 1, 12, 0, 1, tzinfo=UTC)) == datetime(2026, 5, 1, 13, tzinfo=UTC)


def _run_one(text: str) -> Run:
    item = next(i for i in replay.read_items(replay.split_path("dev")) if i.domain == "gsm8k")
    task, _ = task_submit(
        submission=TaskSubmission(
            text=text, reference=item.reference, domain=item.domain, source_item=item.id
        ),
        source=Task.Source.CLI,
    )
    run = task.runs.get()
    engine.execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def _calls_made():
    return Step.objects.exclude(status=StepStatus.PENDING).filter(started_at__isnull=False).exclude(vendor="")


def _runs_counted() -> int:
    return RunRollup.objects.filter(grain=Grain.HOUR).aggregate(n=Sum("runs"))["n"] or 0


def test_a_run_s_end_leaves_the_rollups_to_a_fold_and_a_page_folds_before_it_reads(
    replay_pool, no_fold_after_runs
):
    run = _run_one("What is 6 times 7?")
    # The run's end wrote one waiting row, in its transaction, and nothing in the rollups.
    assert list(PendingRollup.objects.values_list("run_id", flat=True)) == [run.pk]
    assert _runs_counted() == 0 and not TaskExposure.objects.exists()

    # The vendor report reads the rollups: it folds first, and counts the run's steps.
    vendors = {s.vendor for s in run.steps.exclude(vendor="")}
    rows = dossiers.vendor_exposure(since=None, until=None)
    assert {r["vendor"] for r in rows} == vendors
    assert sum(r["steps"] for r in rows) == _calls_made().count() > 0
    assert not PendingRollup.objects.exists()
    assert _runs_counted() == 1
    kept = _snapshot()
    folds.rebuild()
    assert _snapshot() == kept  # folded equals recounted


def test_a_process_folds_its_runs_after_their_end_when_its_last_fold_is_old_enough(replay_pool, settings):
    settings.ROLLUP_FOLD_EVERY_S = 0
    run = _run_one("What is 5 plus 8?")
    # Folded after the run's commit, by this process, with no page read.
    assert not PendingRollup.objects.exists()
    assert _runs_counted() == 1
    assert RunRollup.objects.filter(grain=Grain.HOUR).get().runs == 1 and run.status == RunStatus.SUCCEEDED


def test_a_page_waits_for_a_fold_in_progress_and_shows_its_runs(replay_pool, no_fold_after_runs):
    _run_one("What is 9 minus 4?")
    _run_one("What is 12 divided by 3?")
    assert PendingRollup.objects.count() == 2
    folding, finish = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def folder() -> None:  # another process's fold: the waiting rows taken, not yet committed
        from django.db import connection, transaction

        try:
            with transaction.atomic():
                seen["folded"] = folds.fold()
                folding.set()
                finish.wait(30)
        finally:
            connection.close()

    def reader() -> None:
        from django.db import connection

        try:
            seen["rows"] = dossiers.vendor_exposure(since=None, until=None)
        finally:
            connection.close()

    fold_thread = threading.Thread(target=folder)
    fold_thread.start()
    assert folding.wait(30)
    read_thread = threading.Thread(target=reader)
    read_thread.start()
    read_thread.join(1.0)
    assert read_thread.is_alive()  # the page waits for the fold in progress ...
    finish.set()
    fold_thread.join(30)
    read_thread.join(30)
    assert seen["folded"] == 2
    # ... and counts both runs' calls, folded once.
    rows = seen["rows"]
    assert sum(r["steps"] for r in rows) == _calls_made().count() > 0  # type: ignore[union-attr]
    assert _runs_counted() == 2 and not PendingRollup.objects.exists()


def test_a_fold_that_fails_after_a_run_leaves_the_run_done_and_waiting_for_the_next_fold(
    replay_pool, settings
):
    from django.db import connection

    settings.ROLLUP_FOLD_EVERY_S = 0
    with connection.cursor() as cursor:  # the fold's statement fails: a table it writes is not there
        cursor.execute("ALTER TABLE routing_runrollup RENAME TO routing_runrollup_away")
    try:
        run = _run_one("What is 7 plus 9?")  # succeeded, and execute_run returned
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE routing_runrollup_away RENAME TO routing_runrollup")
    assert list(PendingRollup.objects.values_list("run_id", flat=True)) == [run.pk]
    assert folds.fold() == 1 and _runs_counted() == 1


def test_a_page_whose_fold_fails_shows_the_rollups_as_they_are_and_the_runs_keep_waiting(
    replay_pool, no_fold_after_runs
):
    from django.db import connection

    run = _run_one("What is 8 times 3?")
    with connection.cursor() as cursor:  # the fold's statement fails: a table it writes is not there
        cursor.execute("ALTER TABLE routing_opsrollup RENAME TO routing_opsrollup_away")
    try:
        assert dossiers.vendor_exposure(since=None, until=None) == []  # the page, without the run
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE routing_opsrollup_away RENAME TO routing_opsrollup")
    assert list(PendingRollup.objects.values_list("run_id", flat=True)) == [run.pk]
    rows = dossiers.vendor_exposure(since=None, until=None)
    assert sum(r["steps"] for r in rows) == _calls_made().count() > 0
    assert not PendingRollup.objects.exists()


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_a_run_that_ends_either_way_waits_for_the_fold_once_and_is_folded(
    live_pool, no_fold_after_runs, outcome
):
    """The run's end leaves exactly one waiting row, whichever way it ends (one statement for a run
    that succeeded on what the engine last read; fail_run's transaction for one that failed), and the
    next fold adds it to the rollups and takes the row out."""
    from routing.models import Grain, PendingRollup, RunRollup
    from tests.openai_server import program_one_step_run
    from tests.routing.test_engine import run_now, submit

    program_one_step_run(live_pool["server"], outcome)
    run = run_now(submit())
    assert run.status == outcome
    assert list(PendingRollup.objects.values_list("run_id", flat=True)) == [run.pk]

    folds.fold()
    assert not PendingRollup.objects.exists()
    for grain in (Grain.HOUR, Grain.DAY):  # counted once in each
        folded = RunRollup.objects.filter(grain=grain, status=outcome).aggregate(runs=Sum("runs"))["runs"]
        assert folded == 1, grain
