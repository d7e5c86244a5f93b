"""A row's JSON document (audit.rows.document) is what its fields would send, by the short way for the
types the engine writes most and by the fields' own get_db_prep_save for the rest."""

import json
import uuid
import warnings
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import connection, models

from audit import rows

AWARE = [
    datetime(2026, 11, 28, 3, 4, 5, 678901, tzinfo=UTC),
    datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=2))),
]
SAMPLES = {
    models.DateTimeField: [*AWARE, datetime(2026, 11, 28, 3, 4, 5), "2026-11-28T03:04:05+00:00"],
    models.DecimalField: [
        Decimal("0.000122"),
        Decimal("1E-12"),
        Decimal("12.50"),
        Decimal("-3"),
        Decimal("0.12345678901234567"),
        1,
        "2.5",
        0.1,
    ],
    models.UUIDField: [uuid.UUID("12345678-1234-5678-1234-567812345678"), "12345678123456781234567812345678"],
    models.BooleanField: [True, False, 1, 0],
    models.CharField: ["text", 'ünïcode \u2028 "quoted" \\ <b>', 12],
    models.TextField: ["a\nb\x00c"[:3], "", 3.5],
    models.JSONField: [{"a": [1, 2.5, None, "é"]}, [], "text", 7],
    models.DateField: [datetime(2026, 1, 2).date()],
}
INTEGERS = [0, 7, 2**40, True, "12"]


def _generic(field, value):
    """What the field's own get_db_prep_save makes of the value, as the document holds it."""
    if value is None or isinstance(field, models.JSONField):
        return value
    prepped = field.get_db_prep_save(value, connection)
    if isinstance(prepped, datetime):
        return prepped.isoformat()
    if isinstance(prepped, Decimal | uuid.UUID):
        return str(prepped)
    return prepped


def _samples(field):
    if isinstance(field, models.ForeignKey):
        return [*_samples(field.target_field), None]
    if isinstance(field, models.IntegerField | models.AutoField | models.BigAutoField):
        return INTEGERS
    for kind, values in SAMPLES.items():
        if isinstance(field, kind):
            return values
    return []


def _engine_fields():
    for app in ("routing", "audit", "training"):
        for model in apps.get_app_config(app).get_models():
            yield from ((model, field) for field in model._meta.concrete_fields)


@pytest.mark.django_db
def test_a_document_holds_what_each_field_would_send_for_every_column_of_the_apps():
    checked = set()
    for model, field in _engine_fields():
        for value in _samples(field):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a naive datetime is warned about both ways
                expected = _generic(field, value)
                got = json.loads(rows.document([(field, value)]))[field.column]
            assert got == json.loads(json.dumps(expected)), (model.__name__, field.name, value)
            assert type(got) is type(json.loads(json.dumps(expected))), (model.__name__, field.name, value)
            checked.add(type(field))
    # every kind of column the engine writes was tried
    assert {
        models.DateTimeField,
        models.DecimalField,
        models.UUIDField,
        models.ForeignKey,
        models.BigAutoField,
        models.PositiveIntegerField,
        models.BooleanField,
        models.CharField,
        models.TextField,
        models.JSONField,
    } <= checked


@pytest.mark.django_db
def test_a_document_refuses_what_its_field_refuses():
    cost = next(f for _, f in _engine_fields() if isinstance(f, models.DecimalField))
    with pytest.raises(ValidationError):
        rows.document([(cost, Decimal("NaN"))])
    with pytest.raises(ValueError, match="Out of range|not JSON compliant"):
        rows.document(
            [(next(f for _, f in _engine_fields() if isinstance(f, models.JSONField)), float("nan"))]
        )
    uuid_field = next(f for _, f in _engine_fields() if isinstance(f, models.UUIDField))
    with pytest.raises(ValidationError):
        rows.document([(uuid_field, "not a uuid")])


@pytest.mark.parametrize("task", [uuid.uuid4(), None])
def test_an_events_document_made_with_its_hash_is_the_document_of_its_fields(task):
    """An event built on a head (audit.chain.plan) takes as its row's document the content its hash
    covers, keyed by column, with its hashes: the same values, column for column, as the document its
    fields make, and the same hash as the verifier computes from them."""
    from audit import chain
    from audit.models import AuditEvent

    payload = {"note": 'ünïcode \u2028 and "quotes" <b>', "cost_usd": "0.0000020000", "n": [1, None, 2.5]}
    fields = {
        "actor_type": "service",
        "actor_id": "",
        "actor_name": "engine",
        "action": "step.succeeded",
        "object_type": "step",
        "object_id": "17",
        "task_id": task,
        "correlation_id": uuid.uuid4() if task else None,
        "payload": payload,
    }
    event = chain._event("run:x", 4, "a" * 64, fields)  # what chain.plan builds each event with
    made = chain.event_document(event)
    fields_only = AuditEvent(**{f.attname: getattr(event, f.attname) for f in chain._EVENT_FIELDS})
    assert json.loads(made) == json.loads(chain.event_document(fields_only))
    assert set(json.loads(made)) == {f.column for f in chain._EVENT_FIELDS}
    assert event.hash == chain.digest(event.prev_hash, chain.event_content(event))
