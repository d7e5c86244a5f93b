"""An event's payload as stored: JSON's own types kept as they are (without encoding and parsing it
again), anything else as DjangoJSONEncoder writes it; NUL characters (which jsonb cannot hold)
replaced. Both ways give the same payload: the chain's hashes are over what is stored."""

from __future__ import annotations

import datetime
import json
import random
import uuid
from decimal import Decimal

from django.core.serializers.json import DjangoJSONEncoder

from audit.services import _jsonable


def round_trip(payload: dict) -> dict:
    """The reference: encoded by Django's encoder, parsed back, NULs replaced."""

    def clean(value):
        if isinstance(value, str):
            return value.replace("\x00", "\ufffd")
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean(json.loads(json.dumps(payload, cls=DjangoJSONEncoder)))


def test_a_payload_of_jsons_own_types_is_stored_as_the_round_trip_stores_it():
    payloads = [
        {"a": 1, "b": [1, 2.5, None, True, "model output\x00with a NUL"], "c": {"d": (1, 2), "e": -0.0}},
        {"big": 2**70, "text": "ünïcode \u2028", "empty": {}, "nested": [[[]]]},
    ]
    rng = random.Random(7)

    def value(depth: int = 0):
        roll = rng.random()
        if depth > 3 or roll < 0.4:
            return rng.choice([1, -5, 2.5, True, False, None, "a\x00b", "z", 10**20])
        if roll < 0.7:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice("abcdef"): value(depth + 1) for _ in range(rng.randint(0, 4))}

    payloads += [{"x": value()} for _ in range(500)]
    for payload in payloads:
        stored = _jsonable(payload)
        assert json.dumps(stored) == json.dumps(round_trip(payload)), payload
        assert "\x00" not in json.dumps(stored, ensure_ascii=False)


def test_other_types_are_written_as_djangos_encoder_writes_them():
    at = datetime.datetime(2026, 11, 27, 4, 5, 6, 789123, tzinfo=datetime.UTC)
    key = uuid.UUID("12345678-1234-5678-1234-567812345678")
    payload = {"cost_usd": Decimal("0.0001234567"), "at": at, "id": key, "by_id": {1: "a"}, "n": float("nan")}

    stored = _jsonable(payload)

    assert stored["cost_usd"] == "0.0001234567"  # money as written, never a float
    assert stored["at"] == "2026-11-27T04:05:06.789Z"
    assert stored["id"] == str(key) and stored["by_id"] == {"1": "a"}
    assert json.dumps(stored) == json.dumps(round_trip(payload))
