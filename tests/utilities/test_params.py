"""Query parameters read strictly (utilities.params): valid dates and moments become aware datetimes in
UTC; invalid ones are refused with a reason. Valid values are tested here, beside the invalid ones
the acceptance sweep sends, because only a valid date reaches the conversion to UTC
(django.utils.timezone has no `utc` since Django 5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from utilities import params


@pytest.mark.parametrize(
    ("value", "end", "expected"),
    [
        ("2026-05-01", False, datetime(2026, 5, 1, tzinfo=UTC)),
        ("2026-05-01", True, datetime(2026, 5, 1, 23, 59, 59, 999999, tzinfo=UTC)),
        ("2026-05-01T10:30", False, datetime(2026, 5, 1, 10, 30, tzinfo=UTC)),
        (
            "2026-05-01T10:30:00+02:00",
            False,
            datetime(2026, 5, 1, 10, 30, tzinfo=timezone(timedelta(hours=2))),
        ),
    ],
)
def test_a_valid_moment_is_an_aware_datetime(value, end, expected):
    moment = params.moment({"since": value}, "since", end=end)
    assert moment == expected and moment.utcoffset() is not None


@pytest.mark.parametrize("value", ["2026-13-45", "2026-02-30", "2026-01-01T25:00", "yesterday"])
def test_an_invalid_moment_is_refused_with_its_reason(value):
    with pytest.raises(params.InvalidParameter, match="is not a date"):
        params.moment({"since": value}, "since")


def test_a_period_of_two_valid_days_covers_both():
    since, until = params.period({"since": "2026-05-01", "until": "2026-05-02"})
    assert since == datetime(2026, 5, 1, tzinfo=UTC) and until is not None and until > since
