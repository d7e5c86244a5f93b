"""The acceptance record holds every kind it promises, each what it says it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from audit.models import AuditEvent, ChainPurge, LegalHold, PolicyRule
from governance.retention import PURGED
from routing.models import Attempt, ConductorVersion, Decision, Run, RunStatus, Step, StepStatus, Task
from tests.acceptance.record import HOSTILE_TEXT, MARKUP, RLO, TASK_KINDS, Record
from training.models import Dataset, Evaluation, EvaluationRun, JobStatus, Rollout, RolloutBatch, TrainingJob
from training.policy import Policy

pytestmark = pytest.mark.django_db

TERMINAL_STEP = {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED}


def run_of(record: Record, kind: str) -> Run:
    return Run.objects.select_related("task", "conductor_version").get(pk=record.runs[kind])


def steps_of(run: Run) -> list[Step]:
    return list(Step.objects.filter(run=run).order_by("depth", "decision_id", "index"))


def test_every_task_kind_exists_with_its_main_run(record: Record):
    assert set(record.tasks) == set(TASK_KINDS)
    for kind in TASK_KINDS:
        run = run_of(record, kind)
        assert run.task_id == record.tasks[kind], kind
        assert run.kind == Run.Kind.LIVE, kind
    assert len(set(record.tasks.values())) == len(TASK_KINDS)
    assert {"shadow", "rollout", "evaluation"} <= set(record.runs)


def test_conductor_versions(record: Record):
    backends = {k: ConductorVersion.objects.get(pk=pk).backend for k, pk in record.versions.items()}
    assert backends == {"static": "static", "learned": "learned", "llm": "llm", "candidate": "learned"}
    candidate = ConductorVersion.objects.get(pk=record.versions["candidate"])
    assert not candidate.is_active and not candidate.is_shadow
    assert TrainingJob.objects.get(pk=record.jobs["finished"]).candidate_id == candidate.pk


def test_static_learned_and_llm_decisions(record: Record):
    static = run_of(record, "static")
    assert static.status == RunStatus.SUCCEEDED and static.conductor_version.backend == "static"
    assert static.score is not None and static.task.source_item
    assert [s.worker_slug for s in steps_of(static)] == [
        "gpt-4o-mini-2024-07-18",
        "gemini-1.5-flash",
        "gpt-4o-2024-08-06",
    ]

    learned = run_of(record, "learned")
    assert learned.status == RunStatus.SUCCEEDED, learned.error
    decision = Decision.objects.get(run=learned, depth=0)
    assert decision.backend == "learned" and decision.version_name == "learned-v1"
    policy = Policy.from_json(Path(learned.conductor_version.config["policy_path"]).read_text())
    workflows = {a.name.lower() for a in policy.actions}  # as the policy names them, in any case
    candidates = decision.alternatives[0]["candidates"]
    assert candidates and {c["workflow"].lower() for c in candidates} <= workflows
    assert [c.get("chosen") for c in candidates][:1] == [True]  # what it chose comes first

    llm = run_of(record, "llm")
    assert llm.status == RunStatus.SUCCEEDED and llm.score == 1.0
    decision = Decision.objects.get(run=llm)
    assert decision.backend == "llm" and decision.cost_usd > 0
    weighed = decision.alternatives[0]["candidates"]
    assert [c["workers"] for c in weighed] == [["beta"], ["alpha"], ["gamma"]]


def test_nested_and_concurrent(record: Record):
    nested = run_of(record, "nested")
    assert nested.status == RunStatus.SUCCEEDED and nested.final_answer == "408"
    steps = steps_of(nested)
    assert {s.depth for s in steps} == {0, 1, 2}
    assert [s.worker_slug for s in steps if s.depth == 2] == ["gamma"]
    assert Decision.objects.filter(run=nested, depth=2, valid=True).exists()

    concurrent = run_of(record, "concurrent")
    assert concurrent.status == RunStatus.SUCCEEDED
    a, b, _ = steps_of(concurrent)
    assert a.access == [] and b.access == []
    assert a.started_at < b.finished_at and b.started_at < a.finished_at, "independent steps did not overlap"


def test_failed_kinds_say_why(record: Record):
    expected = {
        "invalid_plan": ("invalid_plan", "invalid twice"),
        "policy_block": ("policy_blocked", "blocked by policy 'confidential-no-globex': step 1 (gamma)"),
        "budget_stop": ("cost_budget", "cost budget of $0.0100000000 reached"),
        "provider_500": ("step_failed", "failed after 3 attempt(s): server_error (HTTP 500)"),
    }
    for kind, (reason, message) in expected.items():
        run = run_of(record, kind)
        assert run.status == RunStatus.FAILED, kind
        assert run.stop_reason == reason and message in run.error, (kind, run.stop_reason, run.error)
        assert run.task.status == RunStatus.FAILED and run.task.error == run.error
        assert AuditEvent.objects.filter(correlation_id=run.correlation_id, action="run.failed").exists()
    assert Decision.objects.filter(run=run_of(record, "invalid_plan"), valid=False).count() == 2
    blocked = Decision.objects.filter(run=run_of(record, "policy_block"))
    assert [d.blocked_by for d in blocked] == ["confidential-no-globex"] * 2
    assert not Step.objects.filter(run=run_of(record, "policy_block")).exists()


def test_policy_rules_of_every_kind(record: Record):
    assert set(PolicyRule.objects.values_list("kind", flat=True)) == set(PolicyRule.Kind.values)
    assert AuditEvent.objects.filter(action="policyrule.registered").count() == 3


def test_provider_failures_and_the_lost_call(record: Record):
    def statuses(kind: str) -> list[str]:
        return list(
            Attempt.objects.filter(step__run=run_of(record, kind))
            .order_by("step__index", "number")
            .values_list("status", flat=True)
        )

    # First the scripted failure, last the success (a loaded machine may add a retry in between).
    limited = statuses("provider_429")
    assert (limited[0], limited[-1]) == (Attempt.Status.RATE_LIMITED, Attempt.Status.SUCCEEDED)
    assert statuses("provider_500") == [Attempt.Status.SERVER_ERROR] * 3
    unrun = Step.objects.get(run=run_of(record, "provider_500"), index=1)
    assert unrun.worker_slug == "conductor" and not unrun.attempts.exists() and unrun.started_at is None
    timeout = statuses("provider_timeout")
    assert (timeout[0], timeout[-1]) == (Attempt.Status.TIMEOUT, Attempt.Status.SUCCEEDED)

    lost = run_of(record, "lost_call")
    assert lost.status == RunStatus.SUCCEEDED and lost.deliveries == 2
    assert statuses("lost_call") == [Attempt.Status.SUCCEEDED, Attempt.Status.LOST, Attempt.Status.SUCCEEDED]
    attempt = Attempt.objects.get(step__run=lost, status=Attempt.Status.LOST)
    # Paid for, unrecorded by the provider's answer: an estimate, marked, counted in the totals.
    assert attempt.step.index == 1 and attempt.cost_estimated and attempt.cost_usd > 0
    resumed = AuditEvent.objects.get(correlation_id=lost.correlation_id, action="run.resumed")
    assert resumed.payload["lost_attempts"] == [
        {
            "step_id": attempt.step_id,
            "attempt": attempt.number,
            "cost_usd": str(attempt.cost_usd),
            "input_tokens": attempt.input_tokens,
            "output_tokens": attempt.output_tokens,
            "estimated": True,
        }
    ]
    assert (
        resumed.payload["worker_pid"]
        != AuditEvent.objects.get(correlation_id=lost.correlation_id, action="run.started").payload[
            "worker_pid"
        ]
    )


def test_shadow_held_purged_hostile_queued(record: Record):
    shadow = run_of(record, "shadow")
    assert shadow.kind == Run.Kind.SHADOW and shadow.task_id == record.tasks["shadowed"]
    assert shadow.conductor_version_id == record.versions["candidate"]
    assert shadow.status == RunStatus.SUCCEEDED, shadow.error
    assert run_of(record, "shadowed").conductor_version_id == record.versions["learned"]

    held = Task.objects.get(pk=record.tasks["held"])
    assert LegalHold.objects.filter(task_id=held.pk, released_at__isnull=True).exists()
    assert held.purged_at is None and held.text != PURGED  # past retention, kept by the hold

    purged = Task.objects.get(pk=record.tasks["purged"])
    assert purged.purged_at is not None and (purged.text, purged.final_answer) == (PURGED, PURGED)
    assert all(s.response == PURGED for s in steps_of(run_of(record, "purged")))
    assert ChainPurge.objects.filter(chain=f"run:{run_of(record, 'purged').correlation_id}").exists()
    assert AuditEvent.objects.filter(action="task.purged", task_id=purged.pk).exists()

    hostile = run_of(record, "hostile")
    assert hostile.status == RunStatus.SUCCEEDED
    assert hostile.task.text == HOSTILE_TEXT and RLO in hostile.task.text and MARKUP in hostile.task.text
    assert hostile.task.text.startswith("=HYPERLINK(")
    responses = [s.response for s in steps_of(hostile)]
    assert [r[:2] for r in responses] == ["+1", "-2", "@S"] and all(MARKUP in r for r in responses)

    queued = run_of(record, "queued")
    assert queued.status == RunStatus.QUEUED and queued.task.status == RunStatus.QUEUED
    assert queued.deliveries == 0 and not Step.objects.filter(run=queued).exists()


def test_training_objects(record: Record):
    batch = RolloutBatch.objects.get(pk=record.rollout_batch_id)
    assert batch.status == JobStatus.SUCCEEDED and batch.k == 2
    rollout_run = run_of(record, "rollout")
    assert rollout_run.kind == Run.Kind.ROLLOUT and Rollout.objects.get(run=rollout_run).batch == batch

    dataset = Dataset.objects.get(pk=record.dataset_id)
    assert dataset.counts["groups"] == 2 and dataset.counts["completions"] == 4
    assert set(record.dataset_files) == {
        "train.parquet",
        "validation.parquet",
        "train.jsonl",
        "validation.jsonl",
        "manifest.json",
    }
    for name in record.dataset_files:
        assert (Path(settings.VAR_DIR) / dataset.path / name).is_file(), name

    evaluation = Evaluation.objects.get(pk=record.evaluation_id)
    assert evaluation.status == JobStatus.SUCCEEDED
    assert evaluation.results["candidate"]["n"] == evaluation.results["baseline"]["n"] == 2
    evaluation_run = run_of(record, "evaluation")
    assert evaluation_run.kind == Run.Kind.EVALUATION
    assert EvaluationRun.objects.get(run=evaluation_run).evaluation == evaluation

    finished = TrainingJob.objects.get(pk=record.jobs["finished"])
    cancelled = TrainingJob.objects.get(pk=record.jobs["cancelled"])
    assert finished.status == JobStatus.SUCCEEDED and finished.dataset_id == dataset.pk
    assert cancelled.status == JobStatus.CANCELLED and cancelled.candidate is None
    assert cancelled.started_at is not None and 2 <= cancelled.step < 500  # stopped while training
    assert record.job_artifacts[finished.pk] == ["policy.json"]
    assert record.job_artifacts[cancelled.pk] == []
    for pk, names in record.job_artifacts.items():
        job = TrainingJob.objects.get(pk=pk)
        for name in names:
            assert (Path(settings.VAR_DIR) / job.artifact_path).name == name


def test_the_audit_record_verifies(record: Record):
    from audit.verify import verify

    report = verify()
    assert report.intact, report.summary()


def test_workers(record: Record):
    assert {"alpha", "beta", "gamma", "gpt-4o-2024-08-06"} <= set(record.worker_slugs)


# provider_500's run stops with its conductor step never started: this holds only with the engine's
# settlement of unrun steps (routing/engine/run_failure.py `settle_steps`, which marks them skipped). Before that
# fix the step was left pending; if this fails with provider_500's step 1 "pending", that is the defect.
def test_every_step_of_a_finished_run_is_in_a_terminal_state(record: Record):
    finished = Run.objects.filter(status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED])
    left = [
        (s.run_id, s.run.task_id, s.depth, s.index, s.worker_slug, s.status)
        for s in Step.objects.filter(run__in=finished).exclude(status__in=TERMINAL_STEP).select_related("run")
    ]
    assert not left, left
