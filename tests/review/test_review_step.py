"""A verdict on a step names a step of that run, or it is refused (400) with the reason: never dropped
and recorded on the whole run instead. The page and the API refuse the same values."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.models import Role
from audit.grants import token_create
from audit.models import AuditEvent
from routing.models import Annotation, Step
from tests.review.test_review import session, two_runs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

BIGINT_MAX = 2**63 - 1
NOT_STEP_IDS = ["abc", "1.5", "-3", "0", "9" * 19, str(BIGINT_MAX + 1), "9" * 40]


def nothing_recorded() -> bool:
    return (
        not Annotation.objects.exists() and not AuditEvent.objects.filter(action="annotation.added").exists()
    )


@pytest.mark.parametrize("step", NOT_STEP_IDS)
def test_the_page_refuses_a_step_that_is_not_a_step_id(two_runs, make_user, step):  # noqa: F811
    good, _ = two_runs
    reviewer = session(make_user, "ann", Role.AUDITOR)

    response = reviewer.post(f"/runs/{good.pk}/annotations/", {"verdict": "wrong", "step": step})

    assert response.status_code == 400
    assert "step" in response.content.decode()
    assert nothing_recorded()


def test_the_page_refuses_a_step_of_another_run_with_400(two_runs, make_user):  # noqa: F811
    good, bad = two_runs
    reviewer = session(make_user, "ann", Role.AUDITOR)
    other = Step.objects.filter(run=good).first()

    response = reviewer.post(f"/runs/{bad.pk}/annotations/", {"verdict": "wrong", "step": other.pk})

    assert response.status_code == 400
    assert f"run {bad.pk} has no step {other.pk}" in response.content.decode()
    assert f'href="/tasks/{bad.task_id}/#run-{bad.pk}"' in response.content.decode()
    assert nothing_recorded()


def test_the_page_records_a_verdict_on_the_run_when_no_step_is_chosen(two_runs, make_user):  # noqa: F811
    good, _ = two_runs
    reviewer = session(make_user, "ann", Role.AUDITOR)

    response = reviewer.post(f"/runs/{good.pk}/annotations/", {"verdict": "wrong", "step": ""})

    assert response.status_code == 302
    assert Annotation.objects.get().step is None


@pytest.mark.parametrize("step", [*NOT_STEP_IDS, 1.5, True, 9 * 10**18 + BIGINT_MAX])
def test_the_api_refuses_a_step_that_is_not_a_step_id(two_runs, make_user, step):  # noqa: F811
    good, _ = two_runs
    client = APIClient()
    user = make_user("mira", Role.ML_STAFF)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=user, role=Role.ML_STAFF).key}")

    response = client.post(
        "/api/annotations/", {"run": good.pk, "verdict": "wrong", "step": step}, format="json"
    )

    assert response.status_code == 400, response.json()
    assert "step" in response.json()["detail"]
    assert nothing_recorded()


def test_the_api_refuses_a_step_of_another_run(two_runs, make_user):  # noqa: F811
    good, bad = two_runs
    client = APIClient()
    user = make_user("mira", Role.ML_STAFF)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=user, role=Role.ML_STAFF).key}")
    other = Step.objects.filter(run=good).first()

    response = client.post(
        "/api/annotations/", {"run": bad.pk, "verdict": "wrong", "step": other.pk}, format="json"
    )

    assert response.status_code == 400
    assert response.json() == {"detail": f"run {bad.pk} has no step {other.pk}"}
    assert nothing_recorded()
