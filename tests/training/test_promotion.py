"""Evaluation against the active conductor, promotion (through vLLM's LoRA loading), rollback, shadow mode."""

from __future__ import annotations

from decimal import Decimal

import pytest

from audit.models import AuditEvent
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion, Decision, Run, RunStatus, Task
from routing.services import TaskSubmission, conductor_active, task_submit
from training.models import EvaluationRun, JobStatus
from training.policy import Policy, Workflow
from training.services import (
    TrainingError,
    conductor_promote,
    conductor_rollback,
    evaluation_refresh,
    evaluation_start,
    shadow_set,
)

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
STRONG = "gpt-4o-2024-08-06"


def single_worker_policy(tmp_path, name: str, worker: str) -> ConductorVersion:
    path = tmp_path / f"{name}.json"
    path.write_text(Policy.new([Workflow("single", (worker,))]).to_json())
    return ConductorVersion.objects.create(name=name, backend="learned", config={"policy_path": str(path)})


def submit(text: str = "What is 2 + 2?") -> Task:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.CLI)
    return task


def test_promotion_changes_which_conductor_plans_the_next_task_and_rollback_restores_it(
    replay_pool, tmp_path
):
    baseline = conductor_active()
    candidate = single_worker_policy(tmp_path, "learned-candidate", STRONG)
    assert submit().runs.get().conductor_version == baseline

    conductor_promote(version=candidate, actor=ACTOR)
    assert conductor_active() == candidate
    assert submit("What is 3 + 3?").runs.get().conductor_version == candidate

    restored = conductor_rollback(actor=ACTOR)
    assert restored == baseline == conductor_active()
    assert submit("What is 4 + 4?").runs.get().conductor_version == baseline

    actions = list(
        AuditEvent.objects.filter(action__startswith="conductor.").values_list("action", "payload")
    )
    promoted = [p for a, p in actions if a == "conductor.promoted"]
    assert promoted == [{"name": candidate.name, "previous": baseline.name, "adapter": None}]
    assert ("conductor.rolled_back", {"from": candidate.name, "to": baseline.name}) in actions
    with pytest.raises(TrainingError, match="already the active"):
        conductor_promote(version=baseline, actor=ACTOR)


def test_promoting_an_llm_conductor_loads_its_adapter_into_vllm_first(db, openai_server, tmp_path):
    base = conductor_active()
    version = ConductorVersion.objects.create(
        name="llm-lora-1",
        backend="llm",
        config={
            "model": "hosted_vllm/llm-lora-1",
            "api_base": openai_server.base_url,
            "lora_name": "llm-lora-1",
            "lora_path": str(tmp_path / "adapter"),
        },
    )
    openai_server.lora_status = 404  # vLLM cannot find the adapter: nothing changes
    with pytest.raises(TrainingError, match="vLLM refused the adapter"):
        conductor_promote(version=version, actor=ACTOR)
    assert conductor_active() == base
    assert AuditEvent.objects.filter(action="conductor.promotion_failed", object_id=str(version.pk)).exists()

    openai_server.lora_status = 200
    conductor_promote(version=version, actor=ACTOR)
    assert conductor_active() == version
    assert openai_server.loaded_adapters == {"llm-lora-1": str(tmp_path / "adapter")}
    event = AuditEvent.objects.get(action="conductor.promoted", object_id=str(version.pk))
    assert event.payload["adapter"]["lora_name"] == "llm-lora-1"


def test_a_shadow_conductor_plans_the_same_live_tasks_without_affecting_them(replay_pool, tmp_path):
    from routing import replay

    active = conductor_active()
    shadow = single_worker_policy(tmp_path, "learned-shadow", STRONG)
    with pytest.raises(TrainingError, match="is the active conductor"):
        shadow_set(version=active, actor=ACTOR)
    shadow_set(version=shadow, actor=ACTOR)
    item = replay.read_items(replay.split_path("dev"))[3]
    task, _ = task_submit(
        submission=TaskSubmission(
            text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
        ),
        source=Task.Source.CLI,
    )
    live, shadowed = task.runs.get(kind=Run.Kind.LIVE), task.runs.get(kind=Run.Kind.SHADOW)
    assert (live.conductor_version, shadowed.conductor_version) == (active, shadow)
    engine.execute_run(shadowed.pk)
    task.refresh_from_db()
    assert task.status == RunStatus.QUEUED and task.final_answer == ""  # the shadow run changed nothing
    engine.execute_run(live.pk)
    task.refresh_from_db()
    live.refresh_from_db()
    assert task.status == RunStatus.SUCCEEDED and task.final_answer == live.final_answer
    assert Decision.objects.get(run=shadowed, depth=0).plan["steps"][0]["worker"] == STRONG
    submitted = AuditEvent.objects.get(action="task.submitted", task_id=task.pk)
    assert submitted.payload["shadow"] == {"run_id": shadowed.pk, "conductor": shadow.name}

    shadow_set(version=None, actor=ACTOR)
    assert submit("Another task").runs.count() == 1
    assert list(
        AuditEvent.objects.filter(
            action__in=["conductor.shadow_set", "conductor.shadow_cleared"]
        ).values_list("action", flat=True)
    ) == ["conductor.shadow_set", "conductor.shadow_cleared"]


def test_evaluation_compares_a_candidate_with_the_active_conductor_on_the_same_held_out_items(
    replay_pool, tmp_path
):
    baseline = single_worker_policy(tmp_path, "cheap", "gemma-2-9b-it")
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.filter(pk=baseline.pk).update(is_active=True)
    candidate = single_worker_policy(tmp_path, "strong", STRONG)
    evaluation = evaluation_start(candidate=candidate, split="dev", limit=6, actor=ACTOR)
    assert evaluation.baseline == baseline and len(evaluation.items) == 6
    links = EvaluationRun.objects.filter(evaluation=evaluation)
    assert links.count() == 12 and {link.run.kind for link in links} == {Run.Kind.EVALUATION}
    for link in links[:6]:
        engine.execute_run(link.run_id)
    assert evaluation_refresh(evaluation).status == JobStatus.RUNNING  # half the runs are still queued
    for link in links[6:]:
        engine.execute_run(link.run_id)
    done = evaluation_refresh(evaluation)
    assert done.status == JobStatus.SUCCEEDED
    for side, version in (("candidate", candidate), ("baseline", baseline)):
        result = done.results[side]
        runs = Run.objects.filter(evaluation_run__evaluation=evaluation, evaluation_run__side=side)
        assert result["version"] == version.name and result["n"] == result["finished"] == 6
        assert result["accuracy"] == pytest.approx(sum(r.score or 0 for r in runs) / 6, abs=1e-4)
        assert Decimal(result["usd_per_1000"]) == (sum(r.cost_usd for r in runs) / 6 * 1000).quantize(
            Decimal("0.0001")
        )
        assert result["p95_plan_ms"] is not None
    # gpt-4o costs more than gemma-2-9b per task
    assert Decimal(done.results["candidate"]["usd_per_1000"]) > Decimal(
        done.results["baseline"]["usd_per_1000"]
    )
    assert AuditEvent.objects.filter(action="evaluation.finished", object_id=str(evaluation.pk)).count() == 1
    evaluation_refresh(done)  # a second refresh records nothing new
    assert AuditEvent.objects.filter(action="evaluation.finished", object_id=str(evaluation.pk)).count() == 1
    with pytest.raises(TrainingError, match="is the baseline itself"):
        evaluation_start(candidate=baseline, split="dev", limit=3, actor=ACTOR)


def test_shadowing_an_llm_conductor_loads_its_adapter_first(db, openai_server, tmp_path):
    conductor_active()
    version = ConductorVersion.objects.create(
        name="llm-shadow",
        backend="llm",
        config={
            "model": "hosted_vllm/llm-shadow",
            "api_base": openai_server.base_url,
            "lora_path": str(tmp_path),
        },
    )
    openai_server.lora_status = 500
    with pytest.raises(TrainingError, match="vLLM refused the adapter"):
        shadow_set(version=version, actor=ACTOR)
    version.refresh_from_db()
    assert not version.is_shadow and not AuditEvent.objects.filter(action="conductor.shadow_set").exists()
    openai_server.lora_status = 200
    shadow_set(version=version, actor=ACTOR)
    version.refresh_from_db()
    assert version.is_shadow and openai_server.loaded_adapters == {"llm-shadow": str(tmp_path)}
    event = AuditEvent.objects.get(action="conductor.shadow_set")
    assert event.payload["adapter"]["lora_path"] == str(tmp_path)
