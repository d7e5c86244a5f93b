"""The playground: a task run again as a variation (another worker with an edited instruction, from one
of its steps; another conductor), priced before it runs, audited when started, executed by the engine
as a run of its own that never answers for the task."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import Role
from audit.models import AuditEvent, PolicyRule
from audit.services import Actor
from governance.retention import PURGED, task_purge
from routing.models import ConductorVersion, Run, RunStatus, Step, Task
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished(live_pool):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft it", []), ("beta", "Check it", "all")))])
    server.program("alpha", [Reply("draft: 42")])
    server.program("beta", [Reply("42")])
    run = run_now(submit("What is 6 * 7?"))
    assert run.status == RunStatus.SUCCEEDED
    return run


def shown(preview: str) -> dict[str, str]:
    """What the preview's form posts back with "Run it": the cost shown and what it priced."""
    return {
        name: re.search(rf'name="{name}" value="([^"]*)"', preview)[1] for name in ("estimated_usd", "priced")
    }


def session(make_user, name: str, *roles: str) -> Client:
    client = Client()
    client.force_login(make_user(name, *roles))
    return client


def test_a_step_rerun_with_another_worker_and_an_edited_instruction_is_priced_audited_and_run(
    finished, live_pool, make_user
):
    server = live_pool["server"]
    task = finished.task
    step = Step.objects.get(run=finished, index=1)  # beta's check
    operator = session(make_user, "olga", Role.OPERATOR)
    url = f"/tasks/{task.pk}/playground/"

    task_page = operator.get(f"/tasks/{task.pk}/").content.decode()
    assert f'href="{url}?step={step.pk}"' in task_page and 'id="playground-link"' in task_page
    form = operator.get(url, {"step": step.pk}).content.decode()
    assert '<option value="beta" selected>' in form and ">Check it</textarea>" in form
    asked = {"mode": "worker", "worker": "gamma", "instruction": "Check <b>it</b> twice", "step": step.pk}
    preview = operator.post(url, {**asked, "action": "preview"}).content.decode()
    priced = shown(preview)
    assert (
        Decimal(priced["estimated_usd"]) > 0 and "prompt tokens at $" in preview and "0000/M" not in preview
    )
    assert "Check &lt;b&gt;it&lt;/b&gt; twice" in preview  # the instruction is escaped
    assert not Run.objects.filter(kind=Run.Kind.PLAYGROUND).exists()  # a preview runs nothing

    server.program("gamma", [Reply("43")])
    started = operator.post(url, {**asked, "action": "run", **priced})

    run = Run.objects.get(kind=Run.Kind.PLAYGROUND)
    assert started.status_code == 302 and started["Location"] == f"/tasks/{task.pk}/#run-{run.pk}"
    assert json.loads(run.plan_override)["steps"] == [
        {"worker": "gamma", "instruction": "Check <b>it</b> twice", "access": []}
    ]
    event = AuditEvent.objects.get(action="task.playground_run")
    assert event.actor_name == "olga" and event.correlation_id == run.correlation_id
    assert event.payload["run_id"] == run.pk and event.payload["worker"] == "gamma"
    assert event.payload["from_step"] == step.pk and event.payload["instruction_edited"] is True
    assert event.payload["estimated_usd"] == priced["estimated_usd"]
    run = run_now(run)
    assert run.status == RunStatus.SUCCEEDED and run.final_answer == "43"
    assert server.requests_for("gamma")[-1].user_text.endswith("Check <b>it</b> twice")
    task.refresh_from_db()
    assert task.final_answer == "42" and task.status == RunStatus.SUCCEEDED  # the task's own answer stays
    # Its plan holds the task's words: a purge deletes it with the rest of the content.
    task_purge(task=task, actor=Actor.service("retention"), now=timezone.now())
    assert Run.objects.get(pk=run.pk).plan_override == PURGED


def test_an_untouched_instruction_of_several_lines_is_not_an_edit(live_pool, make_user):
    run = run_now(submit("Line one\r\nline two\n"))
    operator = session(make_user, "olga", Role.OPERATOR)
    url = f"/tasks/{run.task_id}/playground/"
    as_sent = {
        "mode": "worker",
        "worker": "gamma",
        "instruction": "Line one\r\nline two",
    }  # a textarea's CRLF

    preview = operator.post(url, {**as_sent, "action": "preview"}).content.decode()

    assert "gamma answers the task" in preview


def test_another_conductor_plans_the_task_as_a_playground_run(finished, live_pool, make_user):
    other = ConductorVersion.objects.create(
        name="other-llm", backend="llm", config=finished.conductor_version.config
    )
    ml = session(make_user, "mira", Role.ML_STAFF)
    url = f"/tasks/{finished.task_id}/playground/"
    asked = {"mode": "conductor", "conductor": "other-llm"}

    preview = ml.post(url, {**asked, "action": "preview"}).content.decode()
    assert "conductor other-llm plans it" in preview.lower() and "mean cost of all 1 finished runs" in preview
    ml.post(url, {**asked, "action": "run", **shown(preview)})

    run = Run.objects.get(kind=Run.Kind.PLAYGROUND)
    assert run.conductor_version == other and run.plan_override == ""


def test_variations_that_cannot_run_are_refused_with_the_reason_and_start_nothing(
    finished, make_user, live_pool
):
    operator = session(make_user, "olga", Role.OPERATOR)
    url = f"/tasks/{finished.task_id}/playground/"
    cases = [
        ({"mode": "worker", "worker": ""}, "choose either a conductor or a worker"),
        ({"mode": "worker", "worker": "no-such-worker"}, "there is no enabled worker"),
        ({"mode": "conductor", "conductor": "no-such"}, "there is no conductor version"),
        ({"mode": "worker", "worker": "gamma", "step": "999999"}, "this task has no step 999999"),
        ({"mode": "worker", "worker": "gamma", "instruction": "a\x00b"}, "NUL"),
    ]
    for form, reason in cases:
        response = operator.post(url, {**form, "action": "run", "estimated_usd": "0.1"})
        assert response.status_code == 400 and reason in response.content.decode(), reason
    # A form changed after its cost was shown: the new cost is shown, nothing runs.
    changed = operator.post(
        url,
        {"mode": "worker", "worker": "gamma", "action": "run", "estimated_usd": "0.1", "priced": "beta's"},
    )
    assert "changed since its cost was shown" in changed.content.decode()
    assert not Run.objects.filter(kind=Run.Kind.PLAYGROUND).exists()
    assert not AuditEvent.objects.filter(action="task.playground_run").exists()
    # Auditors read, they do not run; a purged task has nothing to run.
    assert session(make_user, "aida", Role.AUDITOR).get(url).status_code == 403
    Task.objects.filter(pk=finished.task_id).update(text=PURGED, purged_at=finished.finished_at)
    purged = operator.post(url, {"mode": "worker", "worker": "gamma", "action": "preview"})
    assert "deleted under the retention policy" in purged.content.decode()


def finished_calls_to_gamma(live_pool) -> list:
    return live_pool["server"].requests_for("gamma")


def test_a_worker_a_policy_withholds_is_blocked_in_the_playground_as_anywhere(finished, make_user, live_pool):
    PolicyRule.objects.create(name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"])
    operator = session(make_user, "olga", Role.OPERATOR)
    url = f"/tasks/{finished.task_id}/playground/"
    asked = {"mode": "worker", "worker": "gamma"}  # gamma's vendor is globex
    preview = operator.post(url, {**asked, "action": "preview"}).content.decode()
    operator.post(url, {**asked, "action": "run", **shown(preview)})

    run = run_now(Run.objects.get(kind=Run.Kind.PLAYGROUND))

    assert run.status == RunStatus.FAILED and run.stop_reason == "policy_blocked"
    assert "blocked by policy 'no-globex'" in run.error
    assert not finished_calls_to_gamma(live_pool)
