"""A realistic record for the acceptance sweep, made through the real engine and the real services.

`build_record` submits tasks with routing.services.task_submit and executes them with the engine
in-process (as tests/routing/test_engine.py does), trains the learned conductor, samples rollouts,
builds a dataset, evaluates a candidate, shadows it, runs and cancels training jobs, places a legal
hold, purges a task through governance.retention, and writes policy rules: one task or object of every
kind that a page of the app can show. Nothing a service makes is inserted by hand.

Workers and conductors:
- the replay pool (load_replay_pool) planned by the static conductor, then by a learned one;
- three loopback workers (alpha, beta, gamma; the OpenAIServer answers for them) and an LLM conductor
  served by the same loopback server, for the kinds that need scripted provider behaviour.

Files (the learned policies, the dataset) are written under `work_dir`, which must stay the app's
VAR_DIR for as long as the record's pages are requested (the `record` fixture sees to that).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from audit.models import PolicyRule
from audit.policies import policy_rule_save
from audit.seals import seal_pending
from audit.services import Actor, event_record, legal_hold_place
from governance.retention import retention_purge
from routing import engine, replay
from routing.models import Attempt, ConductorVersion, DataClass, Run, RunStatus, Task, Worker
from routing.services import (
    TaskSubmission,
    conductor_activate,
    conductor_active,
    task_submit,
    worker_register,
)
from tests.conftest import ROOT, clear_queues, database_url, wait_for
from tests.openai_server import OpenAIServer, Reply, plan_json
from training.itemsets.rows import read_file
from training.itemsets.selectors import split_ids
from training.itemsets.services import items_upload
from training.models import EvaluationRun, JobStatus, Rollout, TrainingJob
from training.rewards import RewardConfig
from training.services import (
    DATASET_FILES,
    dataset_build,
    dataset_files,
    evaluation_refresh,
    evaluation_start,
    job_cancel,
    job_start,
    replay_item_ids,
    rollout_batch_refresh,
    rollouts_start,
    shadow_set,
)
from training.tasks import train_job

TASK_KINDS = (
    "static",
    "learned",
    "llm",
    "nested",
    "concurrent",
    "invalid_plan",
    "policy_block",
    "budget_stop",
    "provider_429",
    "provider_500",
    "provider_timeout",
    "lost_call",
    "shadowed",
    "held",
    "purged",
    "hostile",
    "queued",
)

# Markup, a right-to-left override and spreadsheet formula prefixes: every page and export must show
# them as text (escaped, never executed, never evaluated as a formula).
MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"
RLO = "\u202e"
HOSTILE_TEXT = (
    '=HYPERLINK("https://example.invalid/steal","click me") '
    f"{MARKUP} {RLO}txt.exe{RLO} +1 -2 @SUM(1) What is 2 + 2?"
)
HOSTILE_REPLIES = {
    "alpha": f"+1 {MARKUP} {RLO}4",
    "beta": f"-2 {MARKUP} 4",
    "gamma": f'@SUM(1) =HYPERLINK("https://example.invalid","4") {MARKUP} {RLO}4',
}

LLM_VERSION = "llm-loopback"
LEARNED_VERSION = "learned-v1"
CANDIDATE_VERSION = "learned-candidate"
BUILDER = Actor.service("acceptance-builder")
log = logging.getLogger(__name__)
PROVIDER_TIMEOUT_S = 1.0


@dataclass
class Record:
    tasks: dict[str, uuid.UUID]  # kind -> Task pk (TASK_KINDS)
    runs: dict[str, int]  # kind -> its task's main run; and "shadow", "rollout", "evaluation" runs
    versions: dict[str, int]  # "static", "learned", "llm", "candidate" -> ConductorVersion pk
    jobs: dict[str, int]  # "finished", "cancelled" -> TrainingJob pk
    job_artifacts: dict[int, list[str]]  # job pk -> artifact names its page links to (may be empty)
    dataset_id: int
    dataset_files: list[str]  # file names the dataset page links to (parquet, jsonl, manifest)
    evaluation_id: int
    rollout_batch_id: int
    worker_slugs: list[str]
    item_set: str  # a team's set, uploaded, with a survey of two of its items run


# --- helpers --------------------------------------------------------------------------------------


def _submit(text: str, *, source: str = Task.Source.API, **fields: Any) -> Task:
    task, created = task_submit(submission=TaskSubmission(text=text, **fields), source=source)
    assert created, "the record's tasks are all new"
    return task


def _live_run(task: Task) -> Run:
    return task.runs.get(kind=Run.Kind.LIVE)


def _execute(run: Run) -> Run:
    engine.execute_run(run.pk)
    run.refresh_from_db()
    return run


def _replay_task(item: replay.ReplayItem, *, source: str = Task.Source.CLI) -> Task:
    return _submit(
        item.task, source=source, reference=item.reference, domain=item.domain, source_item=item.id
    )


def _first_item(split: str, domain: str) -> replay.ReplayItem:
    return next(i for i in replay.read_items(replay.split_path(split)) if i.domain == domain)


def _inner_text(body: dict[str, Any]) -> str:
    """The conductor's own user message (the last one; the others are few-shot examples)."""
    return body["messages"][-1]["content"]


def _register_loopback_pool(server: OpenAIServer) -> list[Worker]:
    """alpha and beta (acme, EU; alpha self-hosted) and gamma (globex, US), cleared for confidential
    data so that the policy rules, not a worker's clearance, decide the policy_block task."""
    pool = [
        ("alpha", "acme", "eu-west-1", True, "1.00", "2.00", [*DataClass.values]),
        ("beta", "acme", "eu-west-1", False, "0.50", "1.50", ["public", "internal", "confidential"]),
        ("gamma", "globex", "us-east-1", False, "3.00", "15.00", [*DataClass.values]),
    ]
    workers = []
    for slug, vendor, region, self_hosted, price_in, price_out, classes in pool:
        worker, _ = worker_register(
            slug=slug,
            litellm_model=f"openai/{slug}",
            vendor=vendor,
            actor=BUILDER,
            api_base=server.base_url,
            input_usd_per_mtok=Decimal(price_in),
            output_usd_per_mtok=Decimal(price_out),
            data_classes=classes,
            self_hosted=self_hosted,
            region=region,
            description=f"loopback worker {slug}",
        )
        workers.append(worker)
    return workers


def _register_llm_conductor(server: OpenAIServer) -> ConductorVersion:
    """An LLM conductor on the loopback server (as tests/conftest.py live_pool makes one), registered
    with its audit event as the training app registers versions."""
    with transaction.atomic():
        version = ConductorVersion.objects.create(
            name=LLM_VERSION,
            backend=ConductorVersion.Backend.LLM,
            config={
                "model": "hosted_vllm/conductor",
                "api_base": server.base_url,
                "input_usd_per_mtok": "0.10",
                "output_usd_per_mtok": "0.20",
            },
            notes="the loopback OpenAI server plays the conductor model",
        )
        event_record(
            actor=BUILDER,
            action="conductorversion.registered",
            obj=version,
            payload={"backend": version.backend, "notes": version.notes},
        )
    return version


def _policy_rule(**fields: Any) -> PolicyRule:
    """A rule, checked and stored with its audit event by the same service the admin uses."""
    return policy_rule_save(rule=PolicyRule(**fields), actor=BUILDER, via="acceptance")


def _train(name: str, options: dict[str, Any], dataset: Any = None) -> TrainingJob:
    """A learned-policy job run in-process, as `manage.py train_conductor` runs one."""
    job = job_start(
        name=name, backend="learned", dataset=dataset, options=options, actor=BUILDER, queue=False
    )
    train_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    return job


def _cancelled_job() -> TrainingJob:
    """A job cancelled while it trains: train_job runs in a thread, job_cancel stops it mid-way."""
    job = job_start(
        name="learned-cancelled",
        backend="learned",
        dataset=None,
        options={"limit": 30, "epochs": 500},
        actor=BUILDER,
        queue=False,
    )
    failure: list[BaseException] = []

    def train() -> None:
        try:
            train_job(job.pk)
        except BaseException as exc:  # pragma: no cover - reported below
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=train, name="acceptance-training", daemon=True)
    thread.start()
    wait_for(
        lambda: TrainingJob.objects.get(pk=job.pk).step >= 2, timeout=60, what="the job to make progress"
    )
    job_cancel(job=job, actor=BUILDER)
    thread.join(60)
    assert not thread.is_alive() and not failure, failure
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED, (job.status, job.error, job.log)
    return job


def _job_artifacts(job: TrainingJob) -> list[str]:
    """The artifact files the job's page lists: the file itself, or the files of its directory."""
    if not job.artifact_path:
        return []
    path = Path(settings.VAR_DIR) / job.artifact_path
    if path.is_file():
        return [path.name]
    if path.is_dir():
        return sorted(p.name for p in path.iterdir() if p.is_file())
    return []


@contextmanager
def _separate_process(run: Run) -> Iterator[subprocess.Popen[str]]:
    """`manage.py shell -c` executing the run in a process of its own, against this test database."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CONDUCTOR_VAR_DIR": str(settings.VAR_DIR),
        "CONDUCTOR_RETRY_BACKOFF_S": "0.01",
        "CONDUCTOR_RETRY_BACKOFF_MAX_S": "0.05",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            f"from routing import engine; engine.execute_run({int(run.pk)})",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _lost_call(server: OpenAIServer) -> Run:
    """A worker process killed with SIGKILL while a call is in flight; the run is then finished here.

    Step 0 succeeds in the other process; step 1's reply is held back, the process is killed mid-call,
    and the in-process engine claims the run, records the in-flight attempt as lost and calls again.
    """
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Step one", []), ("beta", "Step two", "all"), thought="two steps"))],
    )
    server.program("alpha", [Reply("alpha says hi", prompt_tokens=100, completion_tokens=10)])
    server.program(
        "beta",
        [
            Reply("never delivered", delay_s=20, prompt_tokens=100, completion_tokens=10),
            Reply("beta says hi after the loss", prompt_tokens=100, completion_tokens=10),
        ],
    )
    task = _submit("Two steps, one of them in a process that dies")
    run = _live_run(task)
    with _separate_process(run) as proc:

        def in_flight() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the separate process ended early:\n{proc.stdout.read()}")  # type: ignore[union-attr]
            return Attempt.objects.filter(
                step__run=run, step__index=1, status=Attempt.Status.STARTED
            ).exists() and bool(server.requests_for("beta"))

        wait_for(in_flight, timeout=90, what="step 1 to be in flight in the separate process")
        run.refresh_from_db()
        assert run.worker_pid == proc.pid, (run.worker_pid, proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    # The dead process's advisory lock goes with its connection; then this process takes the run over.
    wait_for(lambda: not engine.run_is_locked(run.pk), timeout=30, what="the dead process's run lock")
    return _execute(run)


class _Laps:
    """Logs how long each part of the build took (INFO, logger tests.acceptance.record)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        log.info("acceptance record: %s in %.1fs", name, now - self.last)
        self.last = now


# --- the build ------------------------------------------------------------------------------------


def build_record(*, server: OpenAIServer, work_dir: Path) -> Record:
    """Make the record (see the module docstring). Commits as it goes: call it outside any test
    transaction, with the audit triggers on. Takes well under two minutes."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = origin")  # the audit triggers fire, as in production
    with override_settings(
        VAR_DIR=Path(work_dir),
        CONDUCTOR_RETRY_BACKOFF_S=0.01,
        CONDUCTOR_RETRY_BACKOFF_MAX_S=0.05,
        CONDUCTOR_RETRY_AFTER_MAX_S=1.0,
        CONDUCTOR_PROVIDER_TIMEOUT_S=30.0,
    ):
        record = _build(server)
    clear_queues()  # every submission was also queued on the broker; no worker is to take them
    return record


def _build(server: OpenAIServer) -> Record:
    tasks: dict[str, uuid.UUID] = {}
    runs: dict[str, int] = {}
    versions: dict[str, int] = {}
    jobs: dict[str, int] = {}

    lap = _Laps()

    def keep(kind: str, run: Run) -> Run:
        tasks[kind], runs[kind] = run.task_id, run.pk
        return run

    # The replay pool (and static-v1, the active conductor), then the loopback workers and conductor.
    call_command("load_replay_pool", verbosity=0)
    versions["static"] = ConductorVersion.objects.get(name="static-v1", is_active=True).pk
    _register_loopback_pool(server)
    llm = _register_llm_conductor(server)
    versions["llm"] = llm.pk

    lap("pools")
    # static: a MATH level-5 problem, two cheap solvers then a checker that sees both.
    run = keep(
        "static", _execute(_live_run(_replay_task(_first_item("dev", "math-l5"), source=Task.Source.WEB)))
    )
    assert run.status == RunStatus.SUCCEEDED, run.error

    lap("static")
    # learned: train the policy quickly on the train split (as test_learned_conductor does) and activate it.
    call_command(
        "train_conductor",
        LEARNED_VERSION,
        "--limit",
        "60",
        "--epochs",
        "3",
        "--activate",
        stdout=io.StringIO(),
    )
    learned = ConductorVersion.objects.get(name=LEARNED_VERSION, is_active=True)
    versions["learned"] = learned.pk
    run = keep("learned", _execute(_live_run(_replay_task(_first_item("dev", "gsm8k")))))
    assert run.status == RunStatus.SUCCEEDED, run.error

    lap("learned (training included)")
    # Rollouts of the learned conductor (K=2 on two train items), executed by the engine.
    batch = rollouts_start(
        version=learned, items=replay_item_ids("train", 2), k=2, temperature=1.0, actor=BUILDER
    )
    rollout_runs = [r.run for r in Rollout.objects.filter(batch=batch).select_related("run").order_by("pk")]
    for rollout_run in rollout_runs:
        _execute(rollout_run)
    rollout_batch_refresh(batch)
    runs["rollout"] = rollout_runs[0].pk

    # A dataset of them (all groups in train, so that a job can train on its items).
    dataset = dataset_build(
        name="acceptance",
        batch_ids=[batch.pk],
        min_group_size=2,
        reward_config=RewardConfig(format_term=True, cost_penalty_per_usd=1.0),
        validation_fraction=0.0,
        actor=BUILDER,
    )

    lap("rollouts and dataset")
    # A finished job trained on the dataset's items: its candidate is registered, not active.
    finished = _train(CANDIDATE_VERSION, {"epochs": 3}, dataset=dataset)
    jobs["finished"] = finished.pk
    candidate = ConductorVersion.objects.get(pk=finished.candidate_id)
    assert not candidate.is_active
    versions["candidate"] = candidate.pk

    lap("finished job")
    # The candidate evaluated against the learned conductor on two held-out items.
    evaluation = evaluation_start(candidate=candidate, baseline=learned, split="dev", limit=2, actor=BUILDER)
    evaluation_runs = [
        link.run
        for link in EvaluationRun.objects.filter(evaluation=evaluation).select_related("run").order_by("pk")
    ]
    for evaluation_run in evaluation_runs:
        _execute(evaluation_run)
    evaluation = evaluation_refresh(evaluation)
    runs["evaluation"] = evaluation_runs[0].pk

    lap("evaluation")
    # shadowed: the candidate plans a live task beside the learned conductor.
    shadow_set(version=candidate, actor=BUILDER)
    try:
        used = set(Task.objects.filter(source_item__gt="").values_list("source_item", flat=True))
        item = next(i for i in replay.read_items(replay.split_path("dev")) if i.id not in used)
        shadowed = _replay_task(item, source=Task.Source.API)
    finally:
        shadow_set(version=None, actor=BUILDER)
    keep("shadowed", _execute(_live_run(shadowed)))
    runs["shadow"] = _execute(shadowed.runs.get(kind=Run.Kind.SHADOW)).pk

    lap("shadowed")
    # A job cancelled while it trains.
    jobs["cancelled"] = _cancelled_job().pk

    lap("cancelled job")
    # The LLM conductor (loopback) plans everything from here on.
    conductor_activate(version=llm, actor=BUILDER)

    _llm_kinds(server, keep)
    lap("llm kinds")
    _retention_kinds(server, keep)

    lap("held and purged")
    # Policy rules of every kind, scoped to data classes only the policy_block task uses.
    _policy_rule(
        name="restricted-self-hosted",
        kind=PolicyRule.Kind.SELF_HOSTED_ONLY,
        data_classes=["restricted"],
        description="restricted data stays on self-hosted workers",
    )
    _policy_rule(
        name="confidential-no-globex",
        kind=PolicyRule.Kind.VENDOR_BLOCKED,
        data_classes=["confidential"],
        vendors=["globex"],
        description="globex opted out of confidential data",
    )
    _policy_rule(
        name="confidential-stays-in-eu",
        kind=PolicyRule.Kind.REGION_ALLOWED,
        data_classes=["confidential"],
        regions=["eu-west-1"],
        description="confidential data is processed in the EU",
    )
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("gamma", "Finish", "all")))])
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, [Reply(f"{slug} should not be called")])
    run = keep(
        "policy_block",
        _execute(_live_run(_submit("Summarise the confidential merger file", classification="confidential"))),
    )
    assert run.status == RunStatus.FAILED and run.stop_reason == "policy_blocked", run.error

    # queued: submitted, never run.
    keep("queued", _live_run(_submit("Submitted and never run", source=Task.Source.WEB)))

    lap("policy rules, policy_block, queued")
    item_set = _item_set()
    lap("item set")
    missing = set(TASK_KINDS) - set(tasks)
    assert not missing, missing
    seal_pending()  # what beat's sealer does within a second of each run's end
    files = dataset_files(dataset)
    return Record(
        tasks=tasks,
        runs=runs,
        versions=versions,
        jobs=jobs,
        job_artifacts={pk: _job_artifacts(TrainingJob.objects.get(pk=pk)) for pk in jobs.values()},
        dataset_id=dataset.pk,
        dataset_files=[name for name in DATASET_FILES if name in files],
        evaluation_id=evaluation.pk,
        rollout_batch_id=batch.pk,
        worker_slugs=sorted(Worker.objects.values_list("slug", flat=True)),
        item_set=item_set,
    )


def _item_set() -> str:
    """The example file uploaded as a team's set, with hostile text added; two of its items surveyed
    (every worker answers each once), so that its version is frozen and its rollouts are on record."""
    content = (ROOT / "examples" / "unit-conversions.jsonl").read_bytes() + (
        json.dumps(
            {"id": "hostile", "text": HOSTILE_TEXT, "reference": "1", "scorer": "numeric", "kind": "x"}
        )
        + "\n"
    ).encode()
    version, _ = items_upload(
        name="acceptance-items",
        rows=read_file(content, "items.jsonl"),
        filename="items.jsonl",
        content_sha256=hashlib.sha256(content).hexdigest(),
        actor=BUILDER,
    )
    survey = rollouts_start(
        version=conductor_active(), items=split_ids(version.item_set.name, "train", limit=2), k=1,
        temperature=1.0, actor=BUILDER, item_set=version.item_set.name, survey=True,
    )  # fmt: skip
    for rollout in Rollout.objects.filter(batch=survey).select_related("run"):
        _execute(rollout.run)
    return version.item_set.name


def _llm_kinds(server: OpenAIServer, keep: Callable[[str, Run], Run]) -> None:
    """The kinds planned by the LLM conductor on the loopback workers, each with scripted replies."""
    # llm: one step; the token log-probabilities become the alternatives the conductor weighed.
    plan = plan_json(("beta", "Compute 6 * 7. End with the number.", []), thought="one cheap worker")
    prefix, rest = plan.split('"worker": "', 1)
    logprobs = [
        {"token": prefix + '"worker": "', "logprob": 0.0, "top_logprobs": []},
        {
            "token": "beta",
            "logprob": -0.357,
            "top_logprobs": [
                {"token": "beta", "logprob": -0.357},
                {"token": "al", "logprob": -1.609},
                {"token": "gam", "logprob": -2.996},
            ],
        },
        {"token": rest[len("beta") :], "logprob": 0.0, "top_logprobs": []},
    ]
    server.program("conductor", [Reply(plan, logprobs=logprobs, prompt_tokens=300, completion_tokens=40)])
    server.program("beta", [Reply("6 * 7 = 42", prompt_tokens=30, completion_tokens=8)])
    run = keep("llm", _execute(_live_run(_submit("What is 6 * 7?", reference="42", scorer="numeric"))))
    assert run.status == RunStatus.SUCCEEDED, run.error

    # nested: the conductor recurses twice; the deepest plan runs at depth 2.
    plans = {
        0: plan_json(("alpha", "Draft an answer", []), ("conductor", "LEVEL-1: decide on a review", "all")),
        1: plan_json(("beta", "Review the draft", "all"), ("conductor", "LEVEL-2: decide on a check", "all")),
        2: plan_json(("gamma", "Check the review and answer", "all")),
    }

    def nested(body: dict[str, Any]) -> Reply:
        text = _inner_text(body)
        depth = 2 if "LEVEL-2" in text else 1 if "You were called as a step" in text else 0
        return Reply(plans[depth], prompt_tokens=200, completion_tokens=30)

    server.program("conductor", nested)
    server.program("alpha", [Reply("draft: 17 * 24 = 408")])
    server.program("beta", [Reply("the draft looks right: 408")])
    server.program("gamma", [Reply("408")])
    run = keep("nested", _execute(_live_run(_submit("What is 17 * 24?", reference="408", max_depth=2))))
    assert run.status == RunStatus.SUCCEEDED, run.error

    # concurrent: two independent solvers (each takes a while) and a combiner that sees both.
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Solve A", []), ("beta", "Solve B", []), ("gamma", "Combine", "all")))],
    )
    server.program(
        "alpha", [Reply("answer from alpha", delay_s=0.5, prompt_tokens=100, completion_tokens=20)]
    )
    server.program("beta", [Reply("answer from beta", delay_s=0.5, prompt_tokens=80, completion_tokens=10)])
    server.program("gamma", [Reply("42", prompt_tokens=200, completion_tokens=3)])
    run = keep("concurrent", _execute(_live_run(_submit("Two views, then combine them", reference="42"))))
    assert run.status == RunStatus.SUCCEEDED, run.error

    # invalid_plan: malformed twice, the run fails.
    server.program("conductor", [Reply("{not json"), Reply('{"thought": "no steps key"}')])
    run = keep("invalid_plan", _execute(_live_run(_submit("A task the conductor cannot plan"))))
    assert run.status == RunStatus.FAILED and run.stop_reason == "invalid_plan", run.error

    # budget_stop: the first (expensive) call uses up the cost budget; the second never starts.
    server.program(
        "conductor",
        [
            Reply(
                plan_json(("gamma", "Expensive", []), ("alpha", "Next", "all")),
                prompt_tokens=0,
                completion_tokens=0,
            )
        ],
    )
    server.program("gamma", [Reply("pricey", prompt_tokens=1000, completion_tokens=1000)])  # $0.018
    server.program("alpha", [Reply("never")])
    run = keep("budget_stop", _execute(_live_run(_submit("Spend too much", max_usd=Decimal("0.01")))))
    assert run.status == RunStatus.FAILED and run.stop_reason == "cost_budget", run.error

    # Provider failures: 429 then success, 500 until the attempts run out, a timeout then success.
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program(
        "alpha",
        [Reply(status=429, headers={"Retry-After": "0.1"}), Reply("after the wait", prompt_tokens=50)],
    )
    run = keep("provider_429", _execute(_live_run(_submit("Rate limited once"))))
    assert run.status == RunStatus.SUCCEEDED, run.error

    # The conductor step after the failing one never starts: the run ends with it unrun.
    server.program(
        "conductor", [Reply(plan_json(("alpha", "Do it", []), ("conductor", "Check the answer", "all")))]
    )
    server.program("alpha", [Reply(status=500)])
    run = keep("provider_500", _execute(_live_run(_submit("The provider keeps failing"))))
    assert run.status == RunStatus.FAILED and run.stop_reason == "step_failed", run.error

    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("too late", delay_s=PROVIDER_TIMEOUT_S * 2.5), Reply("in time")])
    with override_settings(CONDUCTOR_PROVIDER_TIMEOUT_S=PROVIDER_TIMEOUT_S):
        run = keep("provider_timeout", _execute(_live_run(_submit("The first call times out"))))
    assert run.status == RunStatus.SUCCEEDED, run.error

    # lost_call: a process killed mid-call, the run finished here.
    run = keep("lost_call", _lost_call(server))
    assert run.status == RunStatus.SUCCEEDED, run.error

    # hostile: markup, a right-to-left override and formula prefixes in the task and every response.
    server.program(
        "conductor",
        [
            Reply(
                plan_json(
                    ("alpha", HOSTILE_TEXT, []),
                    ("beta", f"-2 {MARKUP} check step 0", "all"),
                    ("gamma", f"@SUM(1) {MARKUP} final answer", "all"),
                    thought=f"=1+1 {MARKUP} {RLO}plan",
                )
            )
        ],
    )
    for slug, reply in HOSTILE_REPLIES.items():
        server.program(slug, [Reply(reply)])
    run = keep(
        "hostile",
        _execute(
            _live_run(
                _submit(
                    HOSTILE_TEXT,
                    reference='=HYPERLINK("https://example.invalid")',
                    scorer="exact",
                    source=Task.Source.WEB,
                )
            )
        ),
    )
    assert run.status == RunStatus.SUCCEEDED, run.error


def _retention_kinds(server: OpenAIServer, keep: Callable[[str, Run], Run]) -> None:
    """held and purged: both finished past their retention period; the legal hold keeps one of them,
    governance.retention.retention_purge deletes the content and run chains of the other."""
    made: dict[str, Task] = {}
    for kind in ("held", "purged"):
        server.program(
            "conductor",
            [Reply(plan_json(("alpha", f"Restate the {kind} merger date", []), ("beta", "Check", "all")))],
        )
        server.program("alpha", [Reply(f"draft: the {kind} merger closes on 3 March")])
        server.program("beta", [Reply(f"3 March ({kind} merger)")])
        run = keep(kind, _execute(_live_run(_submit(f"When does the {kind} merger close?", reference="3"))))
        assert run.status == RunStatus.SUCCEEDED, run.error
        made[kind] = run.task
    legal_hold_place(
        task=made["held"], actor=Actor.service("legal-team"), reason="litigation: merger dispute"
    )
    # Past the internal data's retention period (finished, and so submitted, long ago).
    long_ago = timezone.now() - timedelta(days=settings.RETENTION_DAYS[DataClass.INTERNAL] + 35)
    Task.objects.filter(pk__in=[t.pk for t in made.values()]).update(
        created_at=long_ago - timedelta(minutes=5), finished_at=long_ago
    )
    purged = retention_purge()
    assert [t.pk for t in purged] == [made["purged"].pk], purged
