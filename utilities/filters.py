"""Lists' filters as django-filter FilterSets, read with the strict rules of `params`.

A FilterSet declares what a list can be filtered by (the API's schema lists it); each value is read
by a rule of `params`, so a bad value is refused with its reason (`InvalidParameter`, a 400) on a page
as in the API, never dropped. Here, in the bottom package, so that every app's lists can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import django_filters
from django import forms

from . import params

Rule = Callable[[Mapping[str, str], str], Any]


class RuleField(forms.Field):
    """A form field whose value is read by a rule of `params` under the query parameter's name."""

    def __init__(self, *, rule: Rule, param: str, **kwargs):
        self.rule, self.param = rule, param
        super().__init__(**{**kwargs, "required": False})

    def clean(self, value):
        return self.rule({self.param: value or ""}, self.param) or None  # raises InvalidParameter


class RuleFilter(django_filters.Filter):
    field_class = RuleField

    def __init__(self, rule: Rule, *args, **kwargs):
        super().__init__(*args, rule=rule, **kwargs)


def choice(choices, **kwargs) -> RuleFilter:
    """One of the choices (a model's TextChoices)."""
    return RuleFilter(partial(params.choice, choices=[str(c) for c in choices]), **kwargs)


def moment(*, end: bool = False, **kwargs) -> RuleFilter:
    """A day or a date and time (a day's last moment with end=True)."""
    return RuleFilter(partial(params.moment, end=end), **kwargs)


class StrictFilterSet(django_filters.FilterSet):
    """A FilterSet that reads every value with its rule and refuses a bad one (400, with the reason)."""

    def __init__(self, data=None, queryset=None, *, request=None, prefix=None):
        super().__init__(data if data is not None else {}, queryset, request=request, prefix=prefix)
        for name, filter_ in self.filters.items():
            if isinstance(filter_, RuleFilter):
                filter_.extra["param"] = name

    def is_valid(self) -> bool:
        valid = super().is_valid()  # a rule's InvalidParameter propagates from here
        if not valid:  # a field of django-filter's own: its first message, under its name
            name, errors = next(iter(self.form.errors.items()))
            raise params.InvalidParameter(name, " ".join(errors))
        # A period (since, until) that ends before it starts selects nothing: say so.
        since, until = self.form.cleaned_data.get("since"), self.form.cleaned_data.get("until")
        if since and until and until < since:
            raise params.InvalidParameter("until", "is before the start of the period")
        return True

    @property
    def qs(self):
        self.is_valid()
        return super().qs
