"""Settings come from the environment; a malformed value stops start-up and says which and why."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from conductor_web.env import (
    ConfigError,
    env_bool,
    env_choice,
    env_decimal,
    env_float,
    env_int,
    env_list,
    env_str,
)

ROOT = Path(__file__).resolve().parent.parent.parent
SETUP = "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='conductor_web.settings'; django.setup()"


def start_django(tmp_path: Path, **overrides: str | None) -> subprocess.CompletedProcess:
    """django.setup() in a fresh interpreter; an override of None removes the variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CONDUCTOR_"))}
    env.update(
        {
            # The services this test run already uses: no embedded server is started.
            "DATABASE_URL": django_settings.DATABASE_URL,
            "REDIS_URL": django_settings.REDIS_URL,
            # Whatever the subprocess writes (a generated secret key) stays in the test's folder.
            "CONDUCTOR_VAR_DIR": str(tmp_path / "var"),
            "DJANGO_SECRET_KEY": "test-secret-key",
        }
    )
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run(
        [sys.executable, "-c", SETUP],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_valid_environment_starts(tmp_path):
    """The control case: the harness itself can succeed, so the failures below are the bad values."""
    result = start_django(tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"DJANGO_DEBUG": "maybe"}, ["DJANGO_DEBUG='maybe'", "is not a boolean"]),
        ({"CONDUCTOR_PROVIDER_TIMEOUT_S": "abc"}, ["CONDUCTOR_PROVIDER_TIMEOUT_S='abc'", "is not a number"]),
        ({"CONDUCTOR_PROVIDER_TIMEOUT_S": "nan"}, ["CONDUCTOR_PROVIDER_TIMEOUT_S='nan'", "is not a number"]),
        (
            {"CONDUCTOR_STEP_CONCURRENCY": "0"},
            ["CONDUCTOR_STEP_CONCURRENCY=0", "is below the minimum of 1"],
        ),
        (
            {"CONDUCTOR_DEFAULT_MAX_USD": "-1"},
            ["CONDUCTOR_DEFAULT_MAX_USD='-1'", "must be a finite, non-negative amount"],
        ),
        (
            {"CONDUCTOR_DEFAULT_BACKEND": "magic"},
            ["CONDUCTOR_DEFAULT_BACKEND='magic'", "is not one of ['llm', 'static']"],
        ),
        ({"DATABASE_URL": "mysql://u@h/db"}, ["DATABASE_URL must point at PostgreSQL"]),
        (
            {"DJANGO_REQUIRE_SECRET_KEY": "1", "DJANGO_SECRET_KEY": None},
            ["DJANGO_SECRET_KEY must be set in production"],
        ),
    ],
    ids=["debug", "timeout", "timeout-nan", "concurrency", "max-usd", "backend", "database", "secret-key"],
)
def test_bad_value_stops_start_up_naming_the_variable(tmp_path, overrides, expected):
    result = start_django(tmp_path, **overrides)

    assert result.returncode != 0
    assert "ConfigError" in result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


def test_secret_key_is_generated_and_kept_when_not_required(tmp_path):
    first = start_django(tmp_path, DJANGO_SECRET_KEY=None)
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "var" / "secret_key"
    key = key_file.read_text()
    assert len(key) >= 50
    assert key_file.stat().st_mode & 0o777 == 0o600

    second = start_django(tmp_path, DJANGO_SECRET_KEY=None)
    assert second.returncode == 0, second.stderr
    assert key_file.read_text() == key  # sessions survive a restart


def test_debug_allows_a_generated_secret_key_even_when_required(tmp_path):
    result = start_django(tmp_path, DJANGO_SECRET_KEY=None, DJANGO_REQUIRE_SECRET_KEY="1", DJANGO_DEBUG="1")
    assert result.returncode == 0, result.stderr


# --- the typed readers ------------------------------------------------------------------------


def test_env_str(monkeypatch):
    monkeypatch.delenv("X_STR", raising=False)
    assert env_str("X_STR") is None
    assert env_str("X_STR", "fallback") == "fallback"
    monkeypatch.setenv("X_STR", "")
    assert env_str("X_STR", "fallback") == ""  # set but empty is not unset


@pytest.mark.parametrize("value", ["1", "true", "TRUE", " yes ", "On"])
def test_env_bool_true(monkeypatch, value):
    monkeypatch.setenv("X_BOOL", value)
    assert env_bool("X_BOOL", False) is True


@pytest.mark.parametrize("value", ["0", "false", "No", "off", ""])
def test_env_bool_false(monkeypatch, value):
    monkeypatch.setenv("X_BOOL", value)
    assert env_bool("X_BOOL", True) is False


def test_env_bool_default_and_garbage(monkeypatch):
    monkeypatch.delenv("X_BOOL", raising=False)
    assert env_bool("X_BOOL", True) is True
    assert env_bool("X_BOOL", False) is False
    monkeypatch.setenv("X_BOOL", "maybe")
    with pytest.raises(ConfigError, match=r"X_BOOL='maybe' is not a boolean"):
        env_bool("X_BOOL", False)


def test_env_int(monkeypatch):
    monkeypatch.delenv("X_INT", raising=False)
    assert env_int("X_INT", 7, minimum=1) == 7
    monkeypatch.setenv("X_INT", "42")
    assert env_int("X_INT", 7, minimum=1) == 42
    monkeypatch.setenv("X_INT", "1")
    assert env_int("X_INT", 7, minimum=1) == 1  # the minimum itself is allowed
    monkeypatch.setenv("X_INT", "0")
    with pytest.raises(ConfigError, match=r"X_INT=0 is below the minimum of 1"):
        env_int("X_INT", 7, minimum=1)
    monkeypatch.setenv("X_INT", "-3")
    assert env_int("X_INT", 7) == -3  # no minimum, no check
    for bad in ("abc", "1.5", ""):
        monkeypatch.setenv("X_INT", bad)
        with pytest.raises(ConfigError, match=r"X_INT=.* is not an integer"):
            env_int("X_INT", 7)


def test_env_float(monkeypatch):
    monkeypatch.delenv("X_FLOAT", raising=False)
    assert env_float("X_FLOAT", 2.5, minimum=0.1) == 2.5
    monkeypatch.setenv("X_FLOAT", "0.25")
    assert env_float("X_FLOAT", 2.5, minimum=0.1) == 0.25
    monkeypatch.setenv("X_FLOAT", "0.05")
    with pytest.raises(ConfigError, match=r"X_FLOAT=0.05 is below the minimum of 0.1"):
        env_float("X_FLOAT", 2.5, minimum=0.1)
    for bad in ("abc", "nan", "NaN"):
        monkeypatch.setenv("X_FLOAT", bad)
        with pytest.raises(ConfigError, match=r"X_FLOAT=.* is not a number"):
            env_float("X_FLOAT", 2.5, minimum=0.1)


def test_env_decimal(monkeypatch):
    monkeypatch.delenv("X_DEC", raising=False)
    assert env_decimal("X_DEC", "1.00") == Decimal("1.00")
    monkeypatch.setenv("X_DEC", "0.0001")
    assert env_decimal("X_DEC", "1.00") == Decimal("0.0001")
    monkeypatch.setenv("X_DEC", "0")
    assert env_decimal("X_DEC", "1.00") == Decimal("0")
    monkeypatch.setenv("X_DEC", "abc")
    with pytest.raises(ConfigError, match=r"X_DEC='abc' is not a decimal amount"):
        env_decimal("X_DEC", "1.00")
    for bad in ("-1", "-0.01", "NaN", "Infinity"):
        monkeypatch.setenv("X_DEC", bad)
        with pytest.raises(ConfigError, match=r"must be a finite, non-negative amount"):
            env_decimal("X_DEC", "1.00")


def test_env_list(monkeypatch):
    monkeypatch.delenv("X_LIST", raising=False)
    assert env_list("X_LIST", ["a"]) == ["a"]
    monkeypatch.setenv("X_LIST", " a.example , b.example,,  ")
    assert env_list("X_LIST", ["a"]) == ["a.example", "b.example"]
    monkeypatch.setenv("X_LIST", "")
    assert env_list("X_LIST", ["a"]) == []  # set and empty means none, not the default


def test_env_choice(monkeypatch):
    monkeypatch.delenv("X_CHOICE", raising=False)
    assert env_choice("X_CHOICE", "static", {"static", "llm"}) == "static"
    monkeypatch.setenv("X_CHOICE", "llm")
    assert env_choice("X_CHOICE", "static", {"static", "llm"}) == "llm"
    for bad in ("magic", "LLM", ""):
        monkeypatch.setenv("X_CHOICE", bad)
        with pytest.raises(ConfigError, match=r"X_CHOICE=.* is not one of \['llm', 'static'\]"):
            env_choice("X_CHOICE", "static", {"static", "llm"})
