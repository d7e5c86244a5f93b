"""Rollouts through the engine become a versioned GRPO dataset that `datasets` loads as-is."""

from __future__ import annotations

import gc
import hashlib
import json
import uuid

import datasets
import pyarrow.parquet as pq
import pytest

from accounts.models import Role
from audit.models import AuditEvent
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion, Decision, Run, RunStatus, Task
from routing.services import conductor_active
from training.models import Dataset, JobStatus, Rollout
from training.rewards import RewardConfig, group_advantages, reward_of
from training.services import (
    TrainingError,
    dataset_build,
    dataset_files,
    dataset_groups,
    dataset_writer,
    rollout_batch_refresh,
    rollouts_start,
)

pytestmark = pytest.mark.django_db(transaction=True)

ITEM = "cruxeval-o:crux-test-#1"  # gpt-4o answers it right, gpt-3.5-turbo wrong (recorded outcomes)
RIGHT, WRONG = "gpt-4o-2024-08-06", "gpt-3.5-turbo-0125"
ACTOR = Actor.service("test")
# What a conductor wrote that is no plan; its escapes in the JSON Lines (written by PostgreSQL) are
# those json.dumps writes.
NOT_A_PLAN = 'not a plan at all: "quoted" \\ \n\t\x01\x1f é ✓ \u2028 😀'


def plan(worker: str) -> str:
    task = Task.objects.get(source_item=ITEM, source=Task.Source.TRAINING)
    return json.dumps(
        {"thought": "t", "steps": [{"worker": worker.lower(), "instruction": task.text, "access": []}]}
    )


def execute_with_plans(batch, plans: list[str]) -> list[Run]:
    """Give each sampled run of the batch a known plan, then run it through the engine."""
    runs = [r.run for r in Rollout.objects.filter(batch=batch).select_related("run").order_by("sample")]
    for run, text in zip(runs, plans, strict=True):
        Run.objects.filter(pk=run.pk).update(plan_override=text)
        engine.execute_run(run.pk)
    return [Run.objects.get(pk=r.pk) for r in runs]


def test_a_dataset_from_known_runs_has_the_expected_groups_rewards_and_advantages(
    replay_pool, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    version = conductor_active()
    batch = rollouts_start(version=version, items=[ITEM], k=3, temperature=1.0, actor=ACTOR)
    task = Task.objects.get(source_item=ITEM)
    assert task.source == Task.Source.TRAINING and task.status == RunStatus.RUNNING
    runs = execute_with_plans(batch, [plan(RIGHT), plan(WRONG), NOT_A_PLAN])
    assert [r.kind for r in runs] == [Run.Kind.ROLLOUT] * 3
    assert [r.score for r in runs[:2]] == [1.0, 0.0] and runs[2].stop_reason == "invalid_plan"
    assert Decision.objects.get(run=runs[0]).backend == "given"
    batch.refresh_from_db()
    assert batch.status == JobStatus.SUCCEEDED  # when its last run ended, read by no page, no beat
    assert rollout_batch_refresh(batch) == {"runs": 3, "finished": 3, "failed": 1}
    task.refresh_from_db()
    assert task.status == RunStatus.SUCCEEDED  # a training item's task settles when its last run ends

    dataset = dataset_build(
        name="crux",
        batch_ids=[batch.pk],
        min_group_size=3,
        reward_config=RewardConfig(format_term=True),
        validation_fraction=0.0,
        actor=ACTOR,
    )
    assert dataset.version == 1
    assert dataset.counts == {
        "groups": 1,
        "train": 1,
        "validation": 0,
        "completions": 3,
        "skipped_groups": 0,
        "ungraded_samples": 0,
        "groups_with_signal": 1,
        "reward_spread_mean": 1.0,
    }
    assert dataset.signal == "1 of 1 groups carry a learning signal" and not dataset.teaches_nothing
    assert dataset.source_run_ids == sorted(r.pk for r in runs)

    files = dataset_files(dataset)
    loaded = datasets.load_dataset("parquet", data_files={"train": str(files["train.parquet"])})["train"]
    row = loaded[0]
    assert row["item"] == ITEM and row["reference"] == task.reference
    assert row["prompt"][0]["role"] == "system" and task.text in row["prompt"][-1]["content"]
    assert row["group_completions"] == [plan(RIGHT), plan(WRONG), NOT_A_PLAN]
    # the paper's format term: 1 right, 0.5 parsed but wrong, 0 unparseable; advantages centred per group
    assert row["rewards"] == [1.0, 0.5, 0.0]
    assert row["advantages"] == [0.5, 0.0, -0.5]
    assert row["parsed"] == [True, True, False]
    as_json = datasets.load_dataset("json", data_files={"train": str(files["train.jsonl"])})["train"]
    assert as_json[0]["rewards"] == row["rewards"] and as_json.column_names == loaded.column_names
    # The files are written column by column with each pool's prompt encoded once: each line is what
    # json.dumps writes for it, the prompt is the conductor's, and Parquet holds the same rows.
    lines = [f"{line}\n" for line in files["train.jsonl"].read_text(encoding="utf-8").split("\n")[:-1]]
    assert [json.dumps(json.loads(line), ensure_ascii=False) + "\n" for line in lines] == lines
    assert json.loads(lines[0])["prompt"] == dataset_groups.conductor_prompt(task)
    assert pq.read_table(files["train.parquet"]).to_pylist() == [json.loads(line) for line in lines]

    manifest = json.loads(files["manifest.json"].read_text())
    digest = hashlib.sha256(
        files["train.jsonl"].read_bytes() + files["validation.jsonl"].read_bytes()
    ).hexdigest()
    assert manifest["content_hash"]["value"] == digest == dataset.content_hash
    assert manifest["source_run_ids"] == dataset.source_run_ids and manifest["filter"]["batch_ids"] == [
        batch.pk
    ]
    event = AuditEvent.objects.get(action="dataset.built", object_id=str(dataset.pk))
    assert event.payload["content_hash"] == digest and event.payload["counts"]["completions"] == 3
    assert AuditEvent.objects.filter(action="rollouts.started", object_id=str(batch.pk)).exists()

    # a cost penalty changes the rewards; the name gets a new version, the first stays as it was
    again = dataset_build(
        name="crux",
        batch_ids=[batch.pk],
        reward_config=RewardConfig(cost_penalty_per_usd=1000.0),
        validation_fraction=0.0,
        actor=ACTOR,
    )
    assert again.version == 2 and again.content_hash != dataset.content_hash
    rewards = json.loads(dataset_files(again)["train.jsonl"].read_text())["rewards"]
    assert rewards[0] == pytest.approx(1.0 - 1000.0 * float(runs[0].cost_usd))
    assert rewards[0] < 1.0 and rewards[2] == 0.0  # the invalid plan made no worker call
    assert (
        dataset_files(dataset)["train.jsonl"].read_text() != dataset_files(again)["train.jsonl"].read_text()
    )


def test_a_dataset_whose_groups_all_earned_alike_says_it_teaches_nothing(
    replay_pool, settings, tmp_path, make_user
):
    from django.test import Client

    from training.forms import JobStartForm

    settings.VAR_DIR = tmp_path
    batch = rollouts_start(version=conductor_active(), items=[ITEM], k=3, temperature=1.0, actor=ACTOR)
    execute_with_plans(batch, [plan(RIGHT)] * 3)  # three samples, one reward: every advantage is 0
    dataset = dataset_build(
        name="flat", batch_ids=[batch.pk], min_group_size=3, validation_fraction=0.0, actor=ACTOR
    )
    assert dataset.counts["groups_with_signal"] == 0 and dataset.counts["reward_spread_mean"] == 0.0
    assert dataset.teaches_nothing and dataset.signal == "0 of 1 groups carry a learning signal"

    client = Client()
    client.force_login(make_user("mira", Role.ML_STAFF))
    html = client.get(f"/training/datasets/{dataset.pk}/").content.decode()
    assert "0 of 1 groups carry a learning signal" in html and "would learn nothing" in html
    labels = [label for _, label in JobStartForm(prefix="job").fields["dataset"].choices]
    assert "flat v1 · 0 of 1 groups carry a learning signal (nothing to learn)" in labels


def test_groups_smaller_than_the_minimum_are_left_out_and_an_empty_selection_is_refused(
    replay_pool, settings, tmp_path, monkeypatch
):
    settings.VAR_DIR = tmp_path
    batch = rollouts_start(version=conductor_active(), items=[ITEM], k=2, temperature=0.7, actor=ACTOR)
    execute_with_plans(batch, [plan(RIGHT), plan(RIGHT)])
    with pytest.raises(TrainingError, match="no group of at least 3"):
        dataset_build(name="small", batch_ids=[batch.pk], min_group_size=3, actor=ACTOR)
    assert not Dataset.objects.exists()
    built = dataset_build(name="small", batch_ids=[batch.pk], min_group_size=2, actor=ACTOR)
    assert built.counts["groups"] == 1
    # Written a group at a time (the build streams in batches), and every reward computed anew: the
    # same files, the same hash.
    monkeypatch.setattr(dataset_writer, "BATCH", 1)
    monkeypatch.setattr(dataset_groups, "MEMO", 1)
    again = dataset_build(name="small", batch_ids=[batch.pk], min_group_size=2, actor=ACTOR)
    assert again.version == 2 and again.content_hash == built.content_hash
    loaded = datasets.load_dataset(
        "parquet", data_files={"train": str(dataset_files(again)["train.parquet"])}
    )
    assert loaded["train"].num_rows == built.counts["train"]


def test_each_prompt_is_the_conductors_whatever_the_task_text(replay_pool, monkeypatch):
    """Prompts are built and encoded once per pool and shape, the task's text encoded on its own and put
    in its place; where the prompt holds the text twice, changed, or depends on it some other way, each
    prompt is built on its own."""
    shape = {"domain": "math", "classification": "public", "max_steps": 4, "max_depth": 1}
    mark = dataset_groups.Prompts.MARK
    texts = [
        'He said "héllo"\n\tthen ✓',
        mark,
        "",
        "{}\\ \u2028 \x01",
        json.dumps(mark) + "\\",
        "a\\",
        "x" * 500,
    ]
    original = dataset_groups.conductor_prompt

    def text_twice(task, pools=None):  # a prompt that also quotes the task in its system message
        messages = original(task, pools)
        messages[0] = {"role": "system", "content": messages[0]["content"] + task.text}
        return messages

    def text_cut(task, pools=None):  # a prompt that quotes the task's text shortened
        return original(Task(text=task.text[:40], source_item=task.source_item, **shape), pools)

    def text_counted(task, pools=None):  # the text once, as it is, and its length elsewhere
        messages = original(task, pools)
        messages[0] = {"role": "system", "content": f"{messages[0]['content']} ({len(task.text)} chars)"}
        return messages

    for conductor_prompt, per_text in (
        (original, False),
        (text_twice, True),
        (text_cut, True),
        (text_counted, True),
    ):
        calls = []

        def counted(task, pools=None, conductor_prompt=conductor_prompt, calls=calls):
            calls.append(task.text)
            return conductor_prompt(task, pools)

        monkeypatch.setattr(dataset_groups, "conductor_prompt", counted)
        prompts = dataset_groups.Prompts()
        for text in texts:
            expected = conductor_prompt(Task(text=text, source_item=ITEM, **shape))
            assert prompts.of(text, item=ITEM, **shape) == json.dumps(expected, ensure_ascii=False), (
                conductor_prompt
            )
        if per_text:  # each text's own prompt
            assert len(calls) > len(texts), (conductor_prompt, calls)
        else:  # the template, from the marker, checked once on a second text
            assert len(calls) == 2, calls


def test_builds_side_by_side_leave_the_cycle_collector_as_the_first_found_it():
    """The collector is off while any build runs, on again when the last one ends, whichever ends
    first; where it was off before, it stays off."""
    first, second = dataset_groups.collector_paused(), dataset_groups.collector_paused()
    assert gc.isenabled()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second build still runs
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()
    try:
        with dataset_groups.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_rollouts_refuse_bad_input_and_create_nothing(replay_pool):
    version = conductor_active()
    for kwargs, message in (
        ({"items": ["no-such-item"], "k": 2, "temperature": 1.0}, "unknown items"),
        ({"items": [], "k": 2, "temperature": 1.0}, "at least one item"),
        ({"items": [ITEM], "k": 0, "temperature": 1.0}, "K must be"),
        ({"items": [ITEM], "k": 2, "temperature": 0.0}, "temperature"),
    ):
        with pytest.raises(TrainingError, match=message):
            rollouts_start(version=version, actor=ACTOR, **kwargs)
    assert not Run.objects.filter(kind=Run.Kind.ROLLOUT).exists()


def test_rollout_runs_sample_at_the_batch_temperature(replay_pool, tmp_path):
    from training.policy import Policy, Workflow

    path = tmp_path / "policy.json"
    path.write_text(Policy.new([Workflow("single", (RIGHT,)), Workflow("single", (WRONG,))]).to_json())
    version = ConductorVersion.objects.create(
        name="sampler", backend="learned", config={"policy_path": str(path)}
    )
    batch = rollouts_start(version=version, items=[ITEM], k=12, temperature=1.0, actor=ACTOR)
    for rollout in Rollout.objects.filter(batch=batch):
        assert rollout.run.temperature == 1.0
        engine.execute_run(rollout.run_id)
    chosen = {
        json.loads(d.raw_output)["steps"][0]["worker"]
        for d in Decision.objects.filter(run__rollout__batch=batch, depth=0)
    }
    # uniform weights: twelve samples at temperature 1 name both workers (a greedy plan would name one)
    assert chosen == {RIGHT.lower(), WRONG.lower()}
    assert batch.status == JobStatus.RUNNING and rollout_batch_refresh(batch)["finished"] == 12


def test_reward_settings():
    config = RewardConfig.from_dict({"correctness": "2", "cost_penalty_per_usd": 10, "format_term": "true"})
    assert config == RewardConfig(correctness=2.0, cost_penalty_per_usd=10.0, format_term=True)
    for bad, message in (
        ({"bonus": 1}, "unknown reward settings"),
        ({"correctness": -1}, "must not be negative"),
        ({"cost_penalty_per_usd": "nan"}, "finite"),
        ({"format_term": "maybe"}, "true or false"),
    ):
        with pytest.raises(ValueError, match=message):
            RewardConfig.from_dict(bad)
    from decimal import Decimal

    plain = RewardConfig(cost_penalty_per_usd=100.0)
    assert reward_of(
        parsed=True, correct=1.0, cost_usd=Decimal("0.002"), config=plain
    ).reward == pytest.approx(0.8)
    assert reward_of(parsed=False, correct=None, cost_usd=Decimal("0"), config=plain).reward == 0.0
    assert group_advantages([1.0, 0.0]) == [0.5, -0.5]
    assert group_advantages([1.0, 0.0], scale=True) == pytest.approx([1.0, -1.0], abs=1e-3)


def test_rows_read_a_few_at_a_time_with_their_tasks_make_the_same_files(
    replay_pool, settings, tmp_path, monkeypatch
):
    """The build reads its rows FETCH at a time, each read with the tasks of its rows: a group whose
    rows span reads keeps the tasks of its first rows. A group's task is its first graded sample's,
    and a sample is ungraded by its own task's reference, even where an item's samples ran two tasks."""
    settings.VAR_DIR = tmp_path
    batch = rollouts_start(version=conductor_active(), items=[ITEM], k=3, temperature=1.0, actor=ACTOR)
    runs = execute_with_plans(batch, [plan(RIGHT), plan(WRONG), plan(RIGHT)])
    Run.objects.filter(pk=runs[0].pk).update(score=None)  # nothing graded it: left out, by its task
    other = Task.objects.get(source_item=ITEM)
    other.pk, other.idempotency_key, other.text = uuid.uuid4(), None, 'another "text" ✓'
    other._state.adding = True
    other.save(force_insert=True)
    Rollout.objects.filter(run__in=runs[1:]).update(task=other)

    built = dataset_build(name="reads", batch_ids=[batch.pk], validation_fraction=0.0, actor=ACTOR)
    assert built.counts["groups"] == 1 and built.counts["ungraded_samples"] == 1
    assert built.source_run_ids == [runs[1].pk, runs[2].pk]
    files = dataset_files(built)
    row = json.loads(files["train.jsonl"].read_text(encoding="utf-8"))
    assert row["task_id"] == str(other.pk) and row["prompt"] == dataset_groups.conductor_prompt(other)
    for fetch in (1, 2):  # each row its own read; a group's rows in two
        monkeypatch.setattr(dataset_groups, "FETCH", fetch)
        again = dataset_build(name="reads", batch_ids=[batch.pk], validation_fraction=0.0, actor=ACTOR)
        assert again.content_hash == built.content_hash and again.counts == built.counts
        for name in ("train.parquet", "validation.parquet"):
            assert pq.read_table(dataset_files(again)[name]).equals(pq.read_table(files[name]))


def test_a_build_that_fails_while_reading_leaves_nothing_and_the_connection_usable(
    replay_pool, settings, tmp_path, monkeypatch
):
    """The rows' reader thread stops when the build fails part way (a read may be under way): no
    dataset, no files, Python's cycle collector (off while the rows stream) on again, and the next
    build on the same connection succeeds."""
    settings.VAR_DIR = tmp_path
    items = [ITEM, "gsm8k:gsm8k-main-test-#1000"]  # the first group is written while the second is read
    batch = rollouts_start(version=conductor_active(), items=items, k=2, temperature=1.0, actor=ACTOR)
    execute_with_plans(batch, [NOT_A_PLAN] * 4)

    collecting = []

    def no_pool(task, pools=None):
        collecting.append(gc.isenabled())
        raise TrainingError("no enabled worker may receive public data: no prompt to write")

    monkeypatch.setattr(dataset_groups, "FETCH", 1)
    monkeypatch.setattr(dataset_writer, "BATCH", 1)
    monkeypatch.setattr(dataset_groups, "conductor_prompt", no_pool)
    with pytest.raises(TrainingError, match="no prompt to write"):
        dataset_build(name="fails", batch_ids=[batch.pk], actor=ACTOR)
    assert not Dataset.objects.exists() and not (tmp_path / "datasets" / "fails" / "v1").exists()
    assert collecting == [False] and gc.isenabled()
    monkeypatch.undo()
    built = dataset_build(name="fails", batch_ids=[batch.pk], actor=ACTOR)
    assert built.version == 1 and built.counts["groups"] == 2 and built.counts["completions"] == 4
