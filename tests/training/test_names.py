"""Names that look alike: training jobs (the conductor versions they register) and datasets are named by
one ASCII pattern (routing.limits.NAME_PATTERN), which the forms, the API and the services check with
the same message."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from audit.models import AuditEvent
from audit.services import Actor
from routing.limits import NAME_PATTERN, name_check
from routing.services import conductor_active
from training import services
from training.forms import DatasetBuildForm, JobStartForm
from training.models import Dataset, TrainingJob

pytestmark = pytest.mark.django_db

API = "/api/training/"
ACTOR = Actor.service("tests")
LOOK_ALIKES = [
    "\u0455tatic-v1",  # Cyrillic small dze: "ѕtatic-v1"
    "st\u03b1tic-v1",  # Greek small alpha: "stαtic-v1"
    "static-v\uff11",  # fullwidth digit one: "static-v１"
    "\uff53tatic-v1",  # fullwidth small s: "ｓtatic-v1"
]


def message_for(name: str) -> str:
    with pytest.raises(ValidationError) as caught:
        name_check(name)
    (message,) = caught.value.messages
    return message


def test_the_pattern_is_ascii_and_documented():
    assert NAME_PATTERN == "^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$"
    assert NAME_PATTERN in (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    for good in ("static-v2", "learned_v3", "A", "9" * 80):
        name_check(good)
    for bad in ("", "-x", "_x", "a" * 81, "a b", "a.b", "a/b", "ok\n", *LOOK_ALIKES):
        assert message_for(bad).startswith("A name is 1 to 80 ASCII characters")
    assert "'ѕ' (U+0455 CYRILLIC SMALL LETTER DZE) is not allowed." in message_for(LOOK_ALIKES[0])
    assert "U+03B1 GREEK SMALL LETTER ALPHA" in message_for(LOOK_ALIKES[1])
    assert "U+FF11 FULLWIDTH DIGIT ONE" in message_for(LOOK_ALIKES[2])


@pytest.mark.parametrize("name", LOOK_ALIKES)
def test_a_look_alike_job_name_is_refused_by_the_form_the_api_and_the_service(page, api, name):
    message = message_for(name)
    conductor_active()  # the page creates the static baseline on first look: not this request's doing
    events = AuditEvent.objects.count()

    form = JobStartForm({"job-name": name, "job-backend": "learned", "job-split": "train"})
    assert not form.is_valid() and form.errors["name"] == [message]

    response = page.post(
        reverse("training:job-start"),
        {"job-name": name, "job-backend": "learned", "job-split": "train", "job-epochs": "2"},
    )
    assert response.status_code == 200 and response.context["job_form"].errors["name"] == [message]

    response = api.post(API + "jobs/", {"name": name, "backend": "learned"}, format="json")
    assert response.status_code == 400 and response.data["errors"] == {"name": [message]}

    with pytest.raises(services.TrainingError) as caught:
        services.job_start(name=name, backend="learned", dataset=None, options={}, actor=ACTOR, queue=False)
    assert str(caught.value) == message
    assert not TrainingJob.objects.exists() and AuditEvent.objects.count() == events


@pytest.mark.parametrize("name", LOOK_ALIKES)
def test_a_look_alike_dataset_name_is_refused_by_the_form_the_api_and_the_service(page, api, name):
    message = message_for(name)
    conductor_active()  # the page creates the static baseline on first look: not this request's doing
    events = AuditEvent.objects.count()

    form = DatasetBuildForm({"dataset-name": name, "dataset-min_group_size": "2"})
    assert not form.is_valid() and form.errors["name"] == [message]

    response = page.post(reverse("training:dataset-build"), {"dataset-name": name})
    assert response.status_code == 200 and response.context["dataset_form"].errors["name"] == [message]

    response = api.post(API + "datasets/", {"name": name}, format="json")
    assert response.status_code == 400 and response.data["errors"] == {"name": [message]}

    with pytest.raises(services.TrainingError) as caught:
        services.dataset_build(name=name, actor=ACTOR)
    assert str(caught.value) == message
    assert not Dataset.objects.exists() and AuditEvent.objects.count() == events


def test_an_ascii_name_passes_everywhere(page, api):
    assert "name" not in JobStartForm({"job-name": "static-v2"}).errors
    assert "name" not in DatasetBuildForm({"dataset-name": "static-v2"}).errors

    job = services.job_start(
        name="static-v2", backend="learned", dataset=None, options={"epochs": 2}, actor=ACTOR, queue=False
    )
    assert job.name == "static-v2"
    assert AuditEvent.objects.filter(action="training.job_started", object_id=str(job.pk)).count() == 1

    # The API gets past the name: the service then refuses it as taken (the job above), not as a name.
    response = api.post(API + "jobs/", {"name": "static-v2", "backend": "learned"}, format="json")
    assert response.status_code == 400 and response.data == {
        "detail": "the name 'static-v2' is taken; choose another"
    }
    # A dataset name passes too: the build stops only at having no rollouts to build from.
    with pytest.raises(services.TrainingError, match="no group of at least 2 finished rollouts"):
        services.dataset_build(name="static-v2", actor=ACTOR)
    response = api.post(API + "datasets/", {"name": "static-v2"}, format="json")
    assert response.status_code == 400 and "no group of at least 2" in response.data["detail"]


@pytest.mark.parametrize("name", LOOK_ALIKES)
def test_a_look_alike_conductor_version_name_is_refused_by_the_model(name):
    """The admin's form and anything else that validates a ConductorVersion run the same rule."""
    from routing.models import ConductorVersion

    version = ConductorVersion(name=name, backend=ConductorVersion.Backend.STATIC, config={})
    with pytest.raises(ValidationError) as refused:
        version.full_clean()
    assert "ASCII" in " ".join(refused.value.message_dict["name"])
