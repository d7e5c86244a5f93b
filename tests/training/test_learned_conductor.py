"""The learned conductor plans live tasks through the engine, cascades included."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from django.core.management import call_command

from routing import engine, replay
from routing.conductors import PlanRequest, WorkerCard
from routing.models import ConductorVersion, Decision, Run, RunStatus, Step, Task
from routing.scoring.scorers import extract_answer
from routing.services import TaskSubmission, conductor_active, task_submit
from training.conductor import LearnedConductor
from training.policy import Policy, Workflow, agree

pytestmark = pytest.mark.django_db(transaction=True)


def run_item(item) -> Run:
    task, _ = task_submit(
        submission=TaskSubmission(
            text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
        ),
        source=Task.Source.CLI,
    )
    engine.execute_run(task.runs.get().pk)
    return Run.objects.get(task=task)


def forced_policy(tmp_path, workflow: Workflow) -> ConductorVersion:
    """A policy whose only action is `workflow`: the test decides the plan, the engine runs it."""
    path = tmp_path / "policy.json"
    path.write_text(Policy.new([workflow]).to_json())
    version = ConductorVersion.objects.create(
        name="learned-test", backend="learned", config={"policy_path": str(path)}
    )
    ConductorVersion.objects.exclude(pk=version.pk).update(is_active=False)
    ConductorVersion.objects.filter(pk=version.pk).update(is_active=True)
    return version


def test_train_conductor_registers_and_activates_a_learned_version(replay_pool, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("train_conductor", "learned-v1", "--limit", "60", "--epochs", "3", "--activate")
    active = conductor_active()
    assert active.name == "learned-v1" and active.backend == "learned"
    item = replay.read_items(replay.split_path("dev"))[0]
    run = run_item(item)
    assert run.status == RunStatus.SUCCEEDED, run.error
    decision = Decision.objects.get(run=run, depth=0)
    assert decision.backend == "learned" and decision.alternatives[0]["candidates"]


@pytest.mark.parametrize("agree", [True, False], ids=["cheap-answers-agree", "cheap-answers-disagree"])
def test_a_cascade_escalates_to_the_judge_only_when_the_cheap_answers_disagree(replay_pool, tmp_path, agree):
    cheap_a, cheap_b, judge = "gpt-4o-mini-2024-07-18", "gemini-1.5-flash", "gpt-4o-2024-08-06"
    items = replay.read_items(replay.split_path("dev"))

    def same(item):
        a, b = item.outcomes[cheap_a]["answer"], item.outcomes[cheap_b]["answer"]
        return a.strip().lower() == b.strip().lower() and a.strip() != ""

    item = next(i for i in items if i.domain == "gsm8k" and same(i) == agree)
    forced_policy(tmp_path, Workflow("cascade", (cheap_a, cheap_b, judge)))

    run = run_item(item)

    assert run.status == RunStatus.SUCCEEDED, run.error
    steps = list(Step.objects.filter(run=run).order_by("depth", "index"))
    nested = Decision.objects.get(run=run, depth=1)
    if agree:
        assert [s.worker_slug for s in steps] == [cheap_a, cheap_b, "conductor"]
        assert json.loads(nested.raw_output)["steps"] == []
    else:
        assert [s.worker_slug for s in steps] == [cheap_a, cheap_b, "conductor", judge]
        assert run.final_answer == steps[-1].response
    assert run.score == (item.outcomes[cheap_a]["score"] if agree else item.outcomes[judge]["score"])


@pytest.mark.parametrize("sides", [True, False], ids=["tie-breaker-sides", "tie-breaker-agrees-with-neither"])
def test_a_vote_asks_the_tie_breaker_then_the_judge_through_nested_conductor_steps(
    replay_pool, tmp_path, sides
):
    cheap_a, cheap_b, tie, judge = (
        "gpt-4o-mini-2024-07-18",
        "gemini-1.5-flash",
        "Qwen2-72B-Instruct",
        "gpt-4o-2024-08-06",
    )
    items = replay.read_items(replay.split_path("dev"))

    def said(item, model):
        return extract_answer(item.outcomes[model]["response"])

    def fits(item):
        a, b, t = said(item, cheap_a), said(item, cheap_b), said(item, tie)
        return (
            not agree(a, b, item.domain) and (agree(t, a, item.domain) or agree(t, b, item.domain)) == sides
        )

    item = next(i for i in items if i.domain == "gsm8k" and fits(i))
    forced_policy(tmp_path, Workflow("vote", (cheap_a, cheap_b, tie, judge)))

    run = run_item(item)

    assert run.status == RunStatus.SUCCEEDED, run.error
    steps = list(Step.objects.filter(run=run).order_by("depth", "index"))
    expected = [cheap_a, cheap_b, "conductor", tie, "conductor"] + ([] if sides else [judge])
    assert [s.worker_slug.lower() for s in steps] == [w.lower() for w in expected]  # as the pool names them
    assert Decision.objects.filter(run=run, depth=2).exists()
    assert run.final_answer == steps[-1 if not sides else 3].response
    assert run.score == float(item.outcomes[tie if sides else judge]["score"])


def _request(**extra) -> PlanRequest:
    cards = [WorkerCard(slug, "v", "", Decimal("1"), Decimal("1")) for slug in ("a", "b", "c")]
    return PlanRequest(
        task_text="add 2 and 3", domain="gsm8k", workers=cards, max_steps=5, may_recurse=True, **extra
    )


def test_with_a_temperature_the_learned_conductor_samples_its_workflow(tmp_path):
    policy = Policy.new([Workflow("single", (w,)) for w in ("a", "b", "c", "unknown")])
    policy.weights[:, 0], policy.weights[:, 1] = 0.3, 0.1  # a is the most probable, b next
    policy.weights[:, 3] = 5.0  # the likeliest of all names a worker the pool lacks: never picked
    path = tmp_path / "policy.json"
    path.write_text(policy.to_json())
    conductor = LearnedConductor({"policy_path": str(path)})

    def pick(**extra) -> str:
        return json.loads(conductor.propose(_request(**extra)).raw_output)["steps"][0]["worker"]

    assert {pick() for _ in range(5)} == {"a"}  # greedy without a temperature
    # The thought says what its number is ("(p=0.62)" read as nothing to an operator or an auditor).
    thought = json.loads(conductor.propose(_request()).raw_output)["thought"]
    assert re.search(
        r"\(the policy's probability for this workflow among the 3 open to this task: 0\.\d\d\)$", thought
    ), thought
    sampled_thought = json.loads(conductor.propose(_request(temperature=1.0, seed=1)).raw_output)["thought"]
    assert re.search(r"\(sampled at temperature 1; its probability among the 3 ", sampled_thought), (
        sampled_thought
    )
    assert {pick(temperature=0.0, seed=s) for s in range(5)} == {"a"}
    sampled = [pick(temperature=1.0, seed=s) for s in range(200)]
    assert set(sampled) == {"a", "b", "c"} and sampled.count("a") > sampled.count("c")
    assert [pick(temperature=1.0, seed=s) for s in range(20)] == sampled[
        :20
    ]  # the seed makes it reproducible


def test_a_learned_policy_is_parsed_once_per_process_and_the_first_plan_counts_its_load(tmp_path):
    from routing.conductors import conductor_load

    version = forced_policy(tmp_path, Workflow("single", ("gpt-4o-mini-2024-07-18",)))
    first, first_ms = conductor_load(version)
    again, again_ms = conductor_load(ConductorVersion.objects.get(pk=version.pk))
    assert again is first and again_ms == 0
    assert isinstance(first, LearnedConductor)
    # Another config (another policy file) is another conductor.
    other = tmp_path / "other.json"
    other.write_text((tmp_path / "policy.json").read_text())
    version.config = {"policy_path": str(other)}
    version.save(update_fields=["config"])
    changed, _ = conductor_load(version)
    assert changed is not first


def _weighed(proposal) -> list[dict]:
    return proposal.alternatives[0]["candidates"]


def test_what_the_learned_conductor_weighed_agrees_with_what_it_chose_and_says(tmp_path):
    """The dossier shows the thought and the weighed list side by side: they must tell one story."""
    actions = [Workflow("single", (w,)) for w in ("a", "b", "qwen2-72b-instruct")]
    policy = Policy.new(actions, kinds={"gsm8k": "numeric"})
    policy.weights[:, 0] = 5.0  # the policy's own first choice: a
    policy.fallback = {"gsm8k": 1}  # the gate keeps b, the kind's fixed workflow
    path = tmp_path / "policy.json"
    path.write_text(policy.to_json())
    conductor = LearnedConductor({"policy_path": str(path)})
    cards = [WorkerCard(s, "v", "", Decimal("1"), Decimal("1")) for s in ("a", "b", "Qwen2-72B-Instruct")]

    def propose(slugs):
        request = PlanRequest(
            task_text="add 2 and 3",
            domain="gsm8k",
            workers=[c for c in cards if c.slug in slugs],
            max_steps=5,
            may_recurse=True,
        )
        return conductor.propose(request)

    gated = propose({"a", "b", "Qwen2-72B-Instruct"})
    thought = json.loads(gated.raw_output)["thought"]
    weighed = _weighed(gated)

    # The fixed workflow chosen comes first, marked so, and the thought says why the likelier one lost.
    assert weighed[0]["workflow"] == "b" and weighed[0].get("chosen") and weighed[0].get("fixed")
    assert "did not beat it in cross-validation" in thought and "a (" in thought
    assert "probability for this workflow: 0.00" not in thought
    assert sum(c["p"] for c in weighed) == pytest.approx(1, abs=1e-3)
    # Workers are named as the pool names them, never as the policy lower-cases them.
    assert "Qwen2-72B-Instruct" in [c["workflow"] for c in weighed]
    assert "qwen2-72b-instruct" not in [c["workflow"] for c in weighed]

    # A worker withheld (a policy rule blocks its vendor) is neither chosen nor shown as weighed.
    withheld = propose({"b", "Qwen2-72B-Instruct"})
    assert "a" not in [c["workflow"] for c in _weighed(withheld)]
    assert json.loads(withheld.raw_output)["steps"][0]["worker"] == "b"
