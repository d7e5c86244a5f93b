"""`manage.py grant_role`: what a newcomer is told, users made with --create, their passwords checked."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.models import ApiToken
from accounts.roles import user_roles
from accounts.tokens import token_hash
from audit.models import AuditEvent
from tests.conftest import ROOT, database_url

pytestmark = pytest.mark.django_db

PASSPHRASE = "a long passphrase"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def grant(*args: str, stdin: str | io.StringIO | None = None) -> str:
    out = io.StringIO()
    options = {} if stdin is None else {"stdin": io.StringIO(stdin) if isinstance(stdin, str) else stdin}
    call_command("grant_role", *args, stdout=out, **options)
    return out.getvalue()


def run_grant_role(*args: str, stdin: str) -> subprocess.CompletedProcess:
    """As from a shell: `echo PASSWORD | python manage.py grant_role ...`."""
    return subprocess.run(
        [sys.executable, "manage.py", "grant_role", *args],
        input=stdin,
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_user_is_an_error_that_says_how_to_create_it():
    with pytest.raises(CommandError) as error:
        grant("alice", "auditor")

    message = str(error.value)
    assert "no user 'alice'" in message
    assert "--create" in message
    assert "echo 'a long passphrase' | python manage.py grant_role alice auditor --create" in message
    assert "createsuperuser" in message
    assert not get_user_model().objects.filter(username="alice").exists()


def test_create_reads_the_password_from_standard_input():
    out = grant("alice", "auditor", "operator", "--create", stdin=f"{PASSPHRASE}\n")

    alice = get_user_model().objects.get(username="alice")
    assert alice.check_password(PASSPHRASE)
    assert user_roles(alice) == {"auditor", "operator"}
    assert out.strip() == "alice: auditor, operator"
    assert AuditEvent.objects.filter(action="user.roles_set", object_id=str(alice.pk)).exists()


def test_password_stdin_reads_standard_input_even_from_a_terminal():
    grant("alice", "auditor", "--create", "--password-stdin", stdin=Terminal(f"{PASSPHRASE}\n"))

    assert get_user_model().objects.get(username="alice").check_password(PASSPHRASE)


def test_on_a_terminal_the_password_is_asked_for_twice(monkeypatch):
    import getpass

    answers = iter([PASSPHRASE, PASSPHRASE])
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(answers))
    grant("alice", "auditor", "--create", stdin=Terminal())
    assert get_user_model().objects.get(username="alice").check_password(PASSPHRASE)

    answers = iter([PASSPHRASE, "something else entirely"])
    with pytest.raises(CommandError, match="differ"):
        grant("bob", "auditor", "--create", stdin=Terminal())
    assert not get_user_model().objects.filter(username="bob").exists()


@pytest.mark.parametrize(
    ("password", "problem"),
    [("short", "too short"), ("", "empty")],
)
def test_create_refuses_a_password_the_validators_refuse(password, problem):
    with pytest.raises(CommandError) as error:
        grant("alice", "auditor", "--create", stdin=f"{password}\n")

    assert problem in str(error.value)
    assert not get_user_model().objects.filter(username="alice").exists()


def test_create_applies_every_configured_validator(settings):
    settings.AUTH_PASSWORD_VALIDATORS = [
        {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
        {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
    ]
    with pytest.raises(CommandError) as error:
        grant("alice", "auditor", "--create", stdin="1234\n")

    assert "too short" in str(error.value) and "entirely numeric" in str(error.value)


def test_no_password_makes_a_token_only_user_and_token_prints_one():
    out = grant("robot", "operator", "--create", "--no-password", "--token", "operator")

    robot = get_user_model().objects.get(username="robot")
    assert not robot.has_usable_password()
    token = ApiToken.objects.get(user=robot)
    assert token.role == "operator"
    printed = out.split("token (operator): ", 1)[1].split()[0]
    assert token.key_hash == token_hash(printed)  # printed once; only its hash is kept
    assert f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" in out


def test_an_existing_user_gets_new_roles_and_keeps_its_password(make_user):
    make_user("carol", "auditor", password=PASSPHRASE)

    grant("carol", "ml_staff", "--create", stdin="ignored\n")

    carol = get_user_model().objects.get(username="carol")
    assert user_roles(carol) == {"ml_staff"}
    assert carol.check_password(PASSPHRASE)


def test_the_help_documents_create_and_the_password_on_standard_input():
    result = subprocess.run(
        [sys.executable, "manage.py", "grant_role", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    text = " ".join(result.stdout.split())
    assert "--create" in text and "standard input" in text and "--password-stdin" in text
    assert "createsuperuser" in text


@pytest.mark.django_db(transaction=True)
def test_the_readme_command_works_from_a_shell(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]  # what it hashes with

    result = run_grant_role("alice", "auditor", "--create", stdin=f"{PASSPHRASE}\n")

    assert result.returncode == 0, result.stderr
    alice = get_user_model().objects.get(username="alice")
    assert alice.check_password(PASSPHRASE) and user_roles(alice) == {"auditor"}


@pytest.mark.django_db(transaction=True)
def test_a_short_password_from_a_shell_is_refused():
    result = run_grant_role("alice", "auditor", "--create", stdin="short\n")

    assert result.returncode != 0
    assert "too short" in result.stderr
    assert not get_user_model().objects.filter(username="alice").exists()
