"""Policy rules applied by the engine: withheld from the conductor, checked in its plan, re-checked
before each call. Against the loopback OpenAI server: a blocked worker's endpoint must see no request."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection

from audit.models import POLICY_EVENT, AuditEvent, PolicyRule
from compliance import selectors
from routing.models import Attempt, Decision, RunStatus, Step, StepStatus, Worker
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


def worker_enum(body: dict) -> list[str]:
    schema = body["structured_outputs"]["json"]
    return schema["properties"]["steps"]["items"]["properties"]["worker"]["enum"]


def self_hosted_only() -> str:
    Worker.objects.filter(slug="alpha").update(
        self_hosted=True, vendor="self-hosted", data_classes=["public", "internal", "confidential"]
    )
    Worker.objects.filter(slug="gamma").update(data_classes=["public", "internal", "confidential"])
    PolicyRule.objects.create(
        name="confidential-self-hosted",
        kind=PolicyRule.Kind.SELF_HOSTED_ONLY,
        data_classes=["confidential"],
    )
    return "confidential"


def vendor_blocked() -> str:
    PolicyRule.objects.create(name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"])
    return "internal"


def region_allowed() -> str:
    Worker.objects.filter(slug__in=["alpha", "beta"]).update(region="eu-west-1")
    Worker.objects.filter(slug="gamma").update(region="us-east-1")
    PolicyRule.objects.create(
        name="internal-stays-in-eu",
        kind=PolicyRule.Kind.REGION_ALLOWED,
        data_classes=["internal"],
        regions=["eu-west-1", "eu-central-1"],
    )
    return "internal"


CASES = [
    # setup, rule that blocks gamma, workers the conductor may name
    (self_hosted_only, "confidential-self-hosted", ["alpha", "conductor"]),
    (vendor_blocked, "no-globex", ["alpha", "beta", "conductor"]),
    (region_allowed, "internal-stays-in-eu", ["alpha", "beta", "conductor"]),
]


@pytest.mark.parametrize(
    ("setup", "rule", "offered"), CASES, ids=["self_hosted_only", "vendor_blocked", "region_allowed"]
)
def test_a_withheld_worker_is_not_offered_and_a_plan_naming_it_is_blocked_twice_then_the_run_fails(
    live_pool, setup: Callable[[], str], rule: str, offered: list[str]
):
    classification = setup()
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("gamma", "Finish", "all")))])
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, [Reply(f"answer from {slug}")])

    run = run_now(submit("Summarise the merger file", classification=classification))

    assert run.status == RunStatus.FAILED
    assert run.stop_reason == "policy_blocked"
    assert f"blocked by policy '{rule}': step 1 (gamma)" in run.error
    conductor_calls = server.requests_for("conductor")
    assert len(conductor_calls) == 2
    for call in conductor_calls:
        assert worker_enum(call.body) == offered
        system = call.body["messages"][0]["content"]  # the pool as described to the conductor
        assert "- alpha (" in system and "- gamma (" not in system
    assert f"blocked by policy '{rule}'" in conductor_calls[1].user_text  # the second try is told why
    # Nothing reached any worker: a blocked plan creates no steps.
    assert not server.requests_for("gamma")
    assert not server.requests_for("alpha") and not server.requests_for("beta")
    assert not Step.objects.filter(run=run).exists()

    decisions = list(Decision.objects.filter(run=run).order_by("attempt"))
    assert [(d.attempt, d.valid, d.blocked_by) for d in decisions] == [(1, False, rule), (2, False, rule)]
    for decision in decisions:
        assert decision.policy_checks["withheld"]["gamma"]["rule"] == rule
        assert decision.policy_checks["withheld"]["gamma"]["allowed"] is False
        verdicts = decision.policy_checks["steps"]
        assert [(v["index"], v["worker"], v["allowed"]) for v in verdicts] == [
            (0, "alpha", True),
            (1, "gamma", False),
        ]
        assert verdicts[1]["rule"] == rule

    blocked = list(
        AuditEvent.objects.filter(correlation_id=run.correlation_id, action="plan.blocked").order_by("seq")
    )
    assert [e.object_id for e in blocked] == [str(d.pk) for d in decisions]
    assert all(e.payload["blocked_by"] == rule and e.chain == f"run:{run.correlation_id}" for e in blocked)
    failed = AuditEvent.objects.get(correlation_id=run.correlation_id, action="run.failed")
    assert failed.payload["stop_reason"] == "policy_blocked"


def test_a_rule_that_applies_to_another_data_class_withholds_nobody(live_pool):
    self_hosted_only()  # confidential only; this task is internal
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("gamma", "Do it", [])))])
    server.program("gamma", [Reply("done")])

    run = run_now(submit(classification="internal"))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert worker_enum(server.requests_for("conductor")[0].body) == ["alpha", "beta", "conductor", "gamma"]
    assert len(server.requests_for("gamma")) == 1


def test_a_rule_enabled_while_the_conductor_answers_blocks_the_plan_it_answered(live_pool):
    """The plan is checked against the rules as they are when it arrives, not as they were when asked."""
    rule = PolicyRule.objects.create(
        name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"], enabled=False
    )
    server = live_pool["server"]
    plan = plan_json(("gamma", "Do it", []))

    def conductor(body: dict) -> Reply:
        try:
            PolicyRule.objects.filter(pk=rule.pk).update(enabled=True)
        finally:
            connection.close()  # this runs on the server's thread, with a connection of its own
        return Reply(plan)

    server.program("conductor", conductor)
    server.program("gamma", [Reply("must not be called")])

    run = run_now(submit())

    assert run.status == RunStatus.FAILED and run.stop_reason == "policy_blocked"
    first, second = server.requests_for("conductor")
    assert "gamma" in worker_enum(first.body)  # offered: the rule was still off when the conductor was asked
    assert "gamma" not in worker_enum(second.body)
    decisions = list(Decision.objects.filter(run=run).order_by("attempt"))
    assert [d.blocked_by for d in decisions] == ["no-globex", "no-globex"]
    assert "gamma" not in decisions[0].policy_checks["withheld"]
    assert decisions[1].policy_checks["withheld"]["gamma"]["rule"] == "no-globex"  # screened again
    assert decisions[0].policy_checks["steps"][0]["allowed"] is False
    assert not server.requests_for("gamma")


@pytest.mark.parametrize("how", ["created", "enabled by SQL"])
def test_a_rule_created_between_planning_and_the_call_stops_the_step_before_the_call(live_pool, how):
    """However a rule changes (the admin, or SQL that moves no timestamp), the next call sees it: the
    engine reads the rules' stamp with each step's fence and the rules again when it moved."""
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("gamma", "Finish", "all")))])

    def alpha(body: dict) -> Reply:
        # An admin adds a rule while step 0 runs: step 1 was planned and checked before it existed.
        try:
            if how == "created":
                PolicyRule.objects.create(
                    name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"]
                )
            else:
                PolicyRule.objects.filter(name="no-globex").update(enabled=True)
        finally:
            connection.close()
        return Reply("draft")

    server.program("alpha", alpha)
    server.program("gamma", [Reply("must not be called")])
    if how != "created":
        PolicyRule.objects.create(
            name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"], enabled=False
        )

    run = run_now(submit())

    assert run.status == RunStatus.FAILED and run.stop_reason == "policy_blocked"
    assert "step 1 blocked by policy 'no-globex' before the call" in run.error
    assert len(server.requests_for("alpha")) == 1
    assert not server.requests_for("gamma")
    decision = Decision.objects.get(run=run)
    assert decision.valid and decision.blocked_by == ""
    assert [v["allowed"] for v in decision.policy_checks["steps"]] == [True, True]  # as planned
    steps = {s.index: s for s in Step.objects.filter(run=run)}
    assert steps[0].status == StepStatus.SUCCEEDED
    assert steps[1].status == StepStatus.FAILED and steps[1].note == "policy no-globex"
    assert not Attempt.objects.filter(step=steps[1]).exists()
    failed = AuditEvent.objects.get(correlation_id=run.correlation_id, action="step.failed")
    assert failed.object_id == str(steps[1].pk) and failed.payload["note"] == "policy no-globex"
    assert not AuditEvent.objects.filter(
        correlation_id=run.correlation_id, action="step.succeeded", object_id=str(steps[1].pk)
    ).exists()


def test_the_task_page_says_which_rule_withheld_which_vendors_workers_and_which_blocked_the_plan(
    live_pool, client, make_user
):
    classification = vendor_blocked()
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("gamma", "Finish", "all")))])
    run = run_now(submit("Summarise the merger file", classification=classification))
    assert run.stop_reason == "policy_blocked"
    gamma = Worker.objects.get(slug="gamma")
    client.force_login(make_user("olga", "operator"))

    page = client.get(f"/tasks/{run.task_id}/").content.decode()

    assert (
        f"Withheld from the conductor by policy:\n<strong>no-globex</strong> (vendor {gamma.vendor}): gamma"
        in page
    )
    assert "Blocked by policy <strong>no-globex</strong>" in page


def test_the_policy_report_lists_blocks_and_rule_changes_through_its_partial_index(
    live_pool, client, make_user
):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("gamma", "Finish", [])))])
    PolicyRule.objects.create(name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"])
    run = run_now(submit())
    assert run.status == RunStatus.FAILED and run.stop_reason == "policy_blocked"

    listed = selectors.policy_events(since=None, until=None)
    actions = [e["action"] for e in listed]
    assert {"plan.blocked", "run.failed"} <= set(actions), actions
    assert [e["id"] for e in listed] == sorted((e["id"] for e in listed), reverse=True)  # newest first
    blocked = next(e for e in listed if e["action"] == "plan.blocked")
    assert blocked["blocked_by"] == "no-globex" and blocked["task_id"] == run.task_id
    client.force_login(make_user("ada", "auditor"))
    page = client.get("/audit/policies/").content.decode()
    assert f'href="/audit/tasks/{run.task_id}/"' in page and "<td>no-globex</td>" in page
    assert "choose a period for older ones" not in page  # fewer than the page shows
    unrelated = AuditEvent.objects.filter(correlation_id=run.correlation_id).exclude(
        pk__in=[e["id"] for e in listed]
    )
    assert unrelated.filter(action="run.started").exists()  # the run's other events are not policy events

    # The report's query states the index's condition, so the planner can read only policy events.
    sql, params = AuditEvent.objects.filter(POLICY_EVENT).order_by("-id")[:500].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "audit_policy_events" in plan, plan


def test_an_allowed_plan_records_each_steps_verdict(live_pool):
    vendor_blocked()
    region = PolicyRule.objects.create(
        name="restricted-stays-in-eu",
        kind=PolicyRule.Kind.REGION_ALLOWED,
        data_classes=["restricted"],
        regions=["eu-west-1"],
    )
    server = live_pool["server"]
    server.program(
        "conductor", [Reply(plan_json(("alpha", "A", []), ("beta", "B", []), ("alpha", "Combine", "all")))]
    )
    server.program("alpha", [Reply("from alpha")])
    server.program("beta", [Reply("from beta")])

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    decision = Decision.objects.get(run=run)
    assert decision.blocked_by == ""
    assert set(decision.policy_checks["withheld"]) == {"gamma"}
    steps = decision.policy_checks["steps"]
    assert [(v["index"], v["worker"], v["vendor"], v["allowed"]) for v in steps] == [
        (0, "alpha", "acme", True),
        (1, "beta", "acme", True),
        (2, "alpha", "acme", True),
    ]
    # The verdict names the rules that were checked (the region rule does not apply to internal data).
    assert all(v["rule"] == "worker-clearance, no-globex" and v["reason"] == "allowed" for v in steps)
    assert region.name not in steps[0]["rule"]
    emitted = AuditEvent.objects.get(correlation_id=run.correlation_id, action="plan.emitted")
    assert emitted.payload["policy_checks"] == decision.policy_checks
    assert not server.requests_for("gamma")


# --- the tables' stamps ---------------------------------------------------------------------------


def stamps() -> tuple[str, str]:
    from audit.policies import RULES_STAMP_SQL
    from routing.engine.workers import WORKERS_STAMP_SQL

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {RULES_STAMP_SQL}, {WORKERS_STAMP_SQL}")
        return cursor.fetchone()


def test_a_tables_stamp_moves_with_every_change_and_only_with_a_change(live_pool):
    from django.db import transaction

    rule = PolicyRule.objects.create(
        name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"]
    )
    rules, workers = stamps()
    PolicyRule.objects.filter(pk=rule.pk).update(enabled=True)  # the same values: nothing changed
    assert stamps() == (rules, workers)
    PolicyRule.objects.filter(pk=rule.pk).update(enabled=False)
    moved, _ = stamps()
    assert moved != rules
    Worker.objects.filter(slug="alpha").update(enabled=False)
    assert stamps()[1] != workers and stamps()[0] == moved  # each table its own

    # A change rolled back leaves its number unused: what was read under it is never another's.
    with pytest.raises(RuntimeError), transaction.atomic():
        PolicyRule.objects.filter(pk=rule.pk).update(enabled=True)
        inside, _ = stamps()
        raise RuntimeError("rolled back")
    assert stamps()[0] == moved
    PolicyRule.objects.filter(pk=rule.pk).update(enabled=True)
    assert stamps()[0] not in (moved, inside)

    # A session with triggers off (maintenance, a logical replica's apply) moves it all the same.
    before, _ = stamps()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute("UPDATE audit_policyrule SET enabled = false")
        finally:
            cursor.execute("SET session_replication_role = origin")
    assert stamps()[0] != before
