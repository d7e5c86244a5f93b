"""Rows the proof covers beside runs and tasks: API tokens, saved views, reviewers' names and the plan a
playground run forces. Each is tampered with by SQL, as a database superuser would; verification must
name it, and a token the record does not describe must authenticate nobody."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from accounts.models import Role
from accounts.tokens import token_hash, token_key_new
from audit.checkpoints import checkpoint_create
from audit.grants import token_create, token_revoke
from audit.services import Actor
from audit.verify import Report, verify
from operations.saved_views.services import view_save
from review.annotations import services as review
from review.playground.services import Variation, playground_run
from routing.models import RunStatus, Step
from tests.audit.support import run_now, sql
from tests.openai_server import Reply

pytestmark = pytest.mark.django_db(transaction=True)

READ = ("/api/audit/events/", "/api/audit/export.csv")


def api(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def named(report: Report, kind: str, *words: str) -> bool:
    """Whether a problem of `kind` says every one of `words`."""
    return any(p.kind == kind and all(w in p.sentence() for w in words) for p in report.problems)


ROW_KINDS = ("token", "saved_view", "row")


def intact_now() -> None:
    """The rows agree with their events before the tampering (the chains' and checkpoints' own checks
    are tests/audit/test_tamper.py's)."""
    checkpoint_create()
    report = verify()
    assert not [p for p in report.problems if p.kind in ROW_KINDS], report.problems


# --- API tokens -----------------------------------------------------------------------------------


def test_a_token_inserted_by_sql_for_an_auditor_is_refused_and_named(audit_files, make_user):
    ann = make_user("ann", Role.AUDITOR)
    recorded = token_create(user=ann, role=Role.AUDITOR)
    assert all(api(recorded.key).get(path).status_code == 200 for path in READ)
    intact_now()

    key = token_key_new()
    sql(
        "INSERT INTO audit_apitoken (key_hash, prefix, user_id, role, name, created_at, expires_at, revoked_by)"
        " VALUES (%s, %s, %s, 'auditor', 'sql', now(), now() + interval '30 days', '')",
        [token_hash(key), key[:10], ann.pk],
    )

    assert all(api(key).get(path).status_code in (401, 403) for path in READ)
    assert "audit record" in api(key).get(READ[0]).json()["detail"]
    assert all(api(recorded.key).get(path).status_code == 200 for path in READ)
    report = verify()
    assert named(report, "token", f"{key[:10]}", "of ann", "no token.created event records it"), (
        report.problems
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("role = 'operator'", ("its role is 'operator' in its row", "recorded 'auditor'")),
        ("expires_at = expires_at + interval '300 days'", ("its expires_at is",)),
        ("user_id = %(other)s", ("its user_id is",)),
        ("key_hash = %(key_hash)s", ("its key_hash_sha256 is",)),
    ],
)
def test_a_token_whose_row_was_changed_by_sql_is_refused_and_named(audit_files, make_user, change, words):
    ann = make_user("ann", Role.AUDITOR, Role.OPERATOR)
    root = make_user("root", Role.ADMIN)
    token = token_create(user=ann, role=Role.AUDITOR, days=7)
    intact_now()
    other_key = token_key_new()

    sql(
        f"UPDATE audit_apitoken SET {change} WHERE id = %(id)s",  # noqa: S608 (the test's own SQL)
        {"id": token.pk, "other": root.pk, "key_hash": token_hash(other_key)},
    )

    key = other_key if "key_hash" in change else token.key
    assert api(key).get(READ[0]).status_code in (401, 403)
    report = verify()
    assert named(report, "token", f"(id {token.pk})", *words), report.problems


def test_a_revoked_token_revived_by_sql_is_refused_and_named(audit_files, make_user):
    ann = make_user("ann", Role.AUDITOR)
    token = token_create(user=ann, role=Role.AUDITOR)
    token_revoke(token=token, actor=Actor.for_user(ann))
    intact_now()

    sql("UPDATE audit_apitoken SET revoked_at = NULL, revoked_by = '' WHERE id = %s", [token.pk])

    assert api(token.key).get(READ[0]).status_code in (401, 403)
    assert named(verify(), "token", f"(id {token.pk})", "not revoked in its row")


# --- saved views ----------------------------------------------------------------------------------


def test_a_saved_view_changed_or_inserted_by_sql_is_named(audit_files, make_user):
    ann = make_user("ann", Role.OPERATOR)
    bob = make_user("bob", Role.OPERATOR)
    mine = view_save(user=ann, name="failed", query="status=failed", shared=False)
    other = view_save(user=ann, name="private", query="status=succeeded", shared=False)
    intact_now()

    sql("UPDATE routing_savedview SET query = 'q=secret' WHERE id = %s", [mine.pk])
    sql(
        "UPDATE routing_savedview SET shared = true, name = 'everyone', owner_id = %s WHERE id = %s",
        [bob.pk, other.pk],
    )
    sql(
        "INSERT INTO routing_savedview (name, owner_id, query, shared, created_at)"
        " VALUES ('planted', %s, 'status=failed', true, now())",
        [ann.pk],
    )
    report = verify()

    assert named(report, "saved_view", f"saved view {mine.pk}", "its query_sha256 is"), report.problems
    assert named(report, "saved_view", f"saved view {mine.pk}", "its filters is ['q']", "recorded ['status']")
    assert named(report, "saved_view", f"saved view {other.pk}", "its shared is True", "recorded False")
    assert named(
        report, "saved_view", f"saved view {other.pk}", "its name is 'everyone'", "recorded 'private'"
    )
    assert named(report, "saved_view", f"saved view {other.pk}", f"its owner is user {bob.pk}", "by ann")
    assert named(report, "saved_view", "('planted')", "no view.saved event records it")


# --- reviewers' names and playground plans (against a real run) ---------------------------------


def test_an_annotations_author_name_changed_by_sql_is_named(finished_run, audit_files, make_user):
    annotation = review.annotation_add(
        verdict=review.Verdict(run_id=finished_run.pk, verdict="wrong", label="arithmetic"),
        user=make_user("ann", Role.AUDITOR),
    )
    intact_now()

    sql("UPDATE routing_annotation SET author_name = 'chief reviewer' WHERE id = %s", [annotation.pk])

    report = verify()
    assert named(
        report, "row", f"annotation {annotation.pk}'s author_name is 'chief reviewer'", "recorded 'ann'"
    ), report.problems


def test_a_playground_runs_forced_plan_changed_by_sql_is_named(
    finished_run, live_pool, audit_files, make_user
):
    variation = Variation(task_id=finished_run.task_id, worker="gamma", instruction="Check it twice")
    run = playground_run(variation=variation, user=make_user("olga", Role.OPERATOR), estimated_usd=None)
    chain = f"run:{run.correlation_id}"
    assert verify(chains=[chain], use_checkpoint=False).intact

    # Before the worker takes it: the run then calls the worker the row forces, and its own events
    # record that plan faithfully; only the playground's event still says which worker was asked for.
    forced = json.loads(run.plan_override)
    forced["steps"][0]["worker"] = "alpha"
    sql("UPDATE routing_run SET plan_override = %s WHERE id = %s", [json.dumps(forced), run.pk])
    live_pool["server"].program("alpha", [Reply("43")])
    run = run_now(run)

    assert run.status == RunStatus.SUCCEEDED and Step.objects.get(run=run).worker_slug == "alpha"
    report = verify(chains=[chain], use_checkpoint=False)
    assert named(report, "row", f"run {run.pk}'s plan_override (sha256)", "task.playground_run"), (
        report.problems
    )
