"""The regex scorer, and the LLM judge: a worker model on a loopback OpenAI-protocol server grades answers."""

from __future__ import annotations

from decimal import Decimal

import pytest

from audit.models import AuditEvent, PolicyRule
from routing import engine, replay
from routing.models import Attempt, DataClass, Decision, Run, Task, Worker
from routing.scoring.scorers import regex, score
from routing.services import SubmissionError, TaskSubmission, task_submit
from tests.openai_server import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def test_regex_scorer_matches_the_whole_extracted_answer():
    assert regex("42 apples", r"\d+ apples?") == 1.0
    assert regex("Answer: 42 apples and more", r"\d+ apples?") == 0.0
    assert regex("anything", "(") == 0.0  # an invalid pattern scores nothing rather than crashing
    assert score(response='{"answer": "Paris"}', reference="paris|lutetia", scorer="regex") == (1.0, "Paris")


def test_a_task_with_an_invalid_regex_reference_is_refused(db):
    with pytest.raises(SubmissionError, match="not a valid regular expression"):
        task_submit(
            submission=TaskSubmission(text="Name a city", reference="([a-z", scorer="regex"),
            source=Task.Source.CLI,
        )
    with pytest.raises(SubmissionError, match="at most 1000"):
        task_submit(
            submission=TaskSubmission(text="Name a city", reference="a" * 1001, scorer="regex"),
            source=Task.Source.CLI,
        )
    assert not Task.objects.exists()


@pytest.fixture
def judge_worker(replay_pool, openai_server, settings):
    settings.CONDUCTOR_JUDGE_WORKER = "grader"
    Worker.objects.create(
        slug="grader",
        display_name="Grader",
        litellm_model="openai/grader",
        api_base=openai_server.base_url,
        vendor="acme",
        input_usd_per_mtok=Decimal("1"),
        output_usd_per_mtok=Decimal("2"),
        price_source=Worker.PriceSource.OVERRIDE,
    )
    return openai_server


def judged_run(classification: str = DataClass.INTERNAL) -> Run:
    item = replay.read_items(replay.split_path("dev"))[0]
    task, _ = task_submit(
        submission=TaskSubmission(
            text=item.task,
            reference=item.reference,
            domain=item.domain,
            source_item=item.id,
            scorer="judge",
            classification=classification,
        ),
        source=Task.Source.CLI,
    )
    run = task.runs.get()
    engine.execute_run(run.pk)
    run.refresh_from_db()
    return run


@pytest.mark.parametrize("verdict,expected", [("CORRECT", 1.0), ("INCORRECT", 0.0), ("I am not sure", None)])
def test_the_judge_scores_the_final_answer_and_its_call_is_costed_and_audited(
    judge_worker, verdict, expected
):
    judge_worker.program("grader", [Reply(verdict, prompt_tokens=300, completion_tokens=2)])
    run = judged_run()
    assert run.score == expected
    (request,) = judge_worker.requests_for("grader")
    sent = request.user_text
    assert run.task.reference in sent and run.task.text in sent
    event = AuditEvent.objects.get(action="score.judged", correlation_id=run.correlation_id)
    assert event.payload["worker"] == "grader" and event.payload["vendor"] == "acme"
    judge_cost = Decimal(300) * 1 / 1_000_000 + Decimal(2) * 2 / 1_000_000
    assert Decimal(event.payload["cost_usd"]) == judge_cost
    attempts = sum(a.cost_usd for a in Attempt.objects.filter(step__run=run))
    decisions = sum(d.cost_usd for d in Decision.objects.filter(run=run))
    assert run.cost_usd == attempts + decisions + judge_cost

    # the judge's vendor saw the task: the auditors' vendor report says so, and lists the task
    from compliance.dossiers import vendor_exposure, vendor_tasks

    (row,) = [r for r in vendor_exposure(since=None, until=None) if r["vendor"] == "acme"]
    assert (row["judged"], row["steps"], row["tasks"]) == (1, 0, 1) and row["cost"] == judge_cost
    assert [
        t.pk
        for t in vendor_tasks(vendor="acme", classification=run.task.classification, since=None, until=None)
    ] == [run.task_id]


@pytest.mark.django_db(transaction=True)
def test_a_judged_run_ended_in_one_statement_records_the_judge_before_its_seal(judge_worker):
    """A judged run ends in one statement: the judge's event, then the sealing event, the judge's cost
    in the run's totals, the task's, and its pending seal, which the sealer appends."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from audit.models import GLOBAL_CHAIN
    from audit.seals import seal_pending
    from audit.verify import verify

    judge_worker.program("grader", [Reply("CORRECT", prompt_tokens=300, completion_tokens=2)])
    judged_run()
    judge_worker.program("grader", [Reply("CORRECT", prompt_tokens=300, completion_tokens=2)])
    with CaptureQueriesContext(connection) as captured:
        run = judged_run()
    (end,) = [q["sql"] for q in captured.captured_queries if 'INSERT INTO "audit_pendingseal"' in q["sql"]]
    assert end.startswith("WITH run_as_assumed AS") and '"action": "score.judged"' in end

    events = list(AuditEvent.objects.filter(correlation_id=run.correlation_id).order_by("seq"))
    assert [e.action for e in events[-2:]] == ["score.judged", "run.succeeded"]
    judge_cost = Decimal(300) * 1 / 1_000_000 + Decimal(2) * 2 / 1_000_000
    attempts = sum(a.cost_usd for a in Attempt.objects.filter(step__run=run))
    decisions = sum(d.cost_usd for d in Decision.objects.filter(run=run))
    assert run.score == 1.0 and run.cost_usd == attempts + decisions + judge_cost
    assert Decimal(events[-1].payload["cost_usd"]) == run.cost_usd
    task = Task.objects.get(pk=run.task_id)
    assert (task.cost_usd, task.input_tokens, task.output_tokens) == (
        run.cost_usd,
        run.input_tokens,
        run.output_tokens,
    )
    assert seal_pending() >= 1
    seal = AuditEvent.objects.get(chain=GLOBAL_CHAIN, action="run.sealed", object_id=str(run.pk))
    assert seal.payload["hash"] == events[-1].hash
    assert verify().intact


def test_a_judge_not_cleared_for_the_data_is_not_asked(judge_worker):
    PolicyRule.objects.create(
        name="no-acme-confidential",
        kind=PolicyRule.Kind.VENDOR_BLOCKED,
        data_classes=[DataClass.CONFIDENTIAL],
        vendors=["acme"],
    )
    judge_worker.program("grader", [Reply("CORRECT")])
    Worker.objects.update(data_classes=[DataClass.PUBLIC, DataClass.INTERNAL, DataClass.CONFIDENTIAL])
    run = judged_run(DataClass.CONFIDENTIAL)
    assert run.score is None and judge_worker.requests_for("grader") == []
    event = AuditEvent.objects.get(action="score.judged", correlation_id=run.correlation_id)
    assert "no-acme-confidential" in event.payload["reason"]
