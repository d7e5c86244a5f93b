"""The job form takes its bounds from the service (training.services.*_LIMITS): what the form lets
through, the service accepts, and the form refuses what the service would (epochs above the
service's 500, for one)."""

from __future__ import annotations

import pytest

from training.forms import JobStartForm, RolloutsForm
from training.services import LEARNED_LIMITS, LORA_LIMITS, MAX_K, MAX_TEMPERATURE, TrainingError, job_options

FORM_NAMES = {"learning_rate": "learning_rate"}  # the form's name of each learned setting
LORA_FORM_NAMES = {"learning_rate": "lora_learning_rate"}


@pytest.mark.parametrize(
    ("bounds", "names"),
    [(LEARNED_LIMITS, FORM_NAMES), (LORA_LIMITS, LORA_FORM_NAMES)],
    ids=["learned", "llm-lora"],
)
def test_every_bounded_field_of_the_job_form_has_the_service_bounds(bounds, names):
    fields = JobStartForm().fields
    checked = 0
    for key, (_kind, low, high) in bounds.items():
        field = fields.get(names.get(key, key))
        if field is None:
            continue  # set through the API only
        assert (field.min_value, field.max_value) == (low, high), key
        checked += 1
    assert checked >= 4


@pytest.mark.django_db
def test_a_value_past_the_service_limit_is_refused_by_the_form_and_the_service():
    high = LEARNED_LIMITS["epochs"][2]
    data = {"name": "too-long", "backend": "learned", "split": "train", "epochs": high + 1}
    form = JobStartForm(data={f"job-{k}": v for k, v in data.items()})
    assert not form.is_valid() and "epochs" in form.errors
    with pytest.raises(TrainingError, match="epochs must be between"):
        job_options("learned", {"epochs": high + 1}, None)


def test_the_rollout_form_stops_where_the_service_does():
    fields = RolloutsForm().fields
    assert fields["k"].max_value == MAX_K and fields["temperature"].max_value == MAX_TEMPERATURE
