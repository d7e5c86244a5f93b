"""Typed reads of the environment. A value that is present but malformed raises at start-up."""

from __future__ import annotations

import math
import os
from decimal import Decimal, InvalidOperation


class ConfigError(RuntimeError):
    """A setting in the environment has a value the app cannot use."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean (use one of 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        parsed = int(value)
    except ValueError as exc:
        raise ConfigError(f"{name}={value!r} is not an integer") from exc
    if minimum is not None and parsed < minimum:
        raise ConfigError(f"{name}={parsed} is below the minimum of {minimum}")
    return parsed


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        parsed = float(value)
    except ValueError as exc:
        raise ConfigError(f"{name}={value!r} is not a number") from exc
    if math.isnan(parsed):  # float() accepts "nan", and NaN passes every minimum check
        raise ConfigError(f"{name}={value!r} is not a number")
    if minimum is not None and parsed < minimum:
        raise ConfigError(f"{name}={parsed} is below the minimum of {minimum}")
    return parsed


def env_decimal(name: str, default: str) -> Decimal:
    value = os.environ.get(name, default)
    try:
        parsed = Decimal(value)
    except InvalidOperation as exc:
        raise ConfigError(f"{name}={value!r} is not a decimal amount") from exc
    if not parsed.is_finite() or parsed < 0:
        raise ConfigError(f"{name}={value!r} must be a finite, non-negative amount")
    return parsed


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: set[str]) -> str:
    value = os.environ.get(name, default)
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {sorted(choices)}")
    return value
