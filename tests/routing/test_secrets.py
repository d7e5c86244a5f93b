"""API keys come only from allowed variables, and no key reaches anything the app stores.

Checked: a worker cannot name a variable outside the allowed ones (DATABASE_URL, say) as its key
variable, so the engine never sends such a value to an endpoint an editor chose; and a provider that
echoes the request's key does not get it into attempt rows, run errors or append-only audit events.
"""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from routing.models import Attempt, ConductorVersion, Run, RunStatus, Step, Worker
from routing.secrets import MAX_ERROR_CHARS, REDACTED, redact
from routing.services import SubmissionError, worker_register
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import run_now, submit

pytestmark = pytest.mark.django_db(transaction=True)

SERVER_VARIABLES = ["DATABASE_URL", "DJANGO_SECRET_KEY", "PATH", "conductor_key_lower", "CONDUCTOR_KEY_"]
KEY = "acme-live-key-0123456789abcdef"


def run_record(run: Run) -> str:
    """Everything stored about a run that a person or an export can read, as one text."""
    parts = [run.error, *Step.objects.filter(run=run).values_list("error", flat=True)]
    parts += Attempt.objects.filter(step__run=run).values_list("error", flat=True)
    parts += [json.dumps(e.payload) for e in AuditEvent.objects.filter(correlation_id=run.correlation_id)]
    return "\n".join(parts)


@pytest.mark.parametrize("name", SERVER_VARIABLES)
def test_a_worker_cannot_name_a_server_variable_as_its_key(name):
    with pytest.raises(SubmissionError, match="CONDUCTOR_KEY_<NAME>"):
        worker_register(
            slug="leaky",
            litellm_model="openai/gpt-4o-mini",
            vendor="openai",
            api_base="http://127.0.0.1:9/v1",
            api_key_env=name,
            actor=_service(),
        )
    with pytest.raises(CommandError, match="cannot hold an API key"):
        call_command(
            "register_worker", "leaky", "openai/gpt-4o-mini", "--vendor=openai", f"--api-key-env={name}"
        )
    worker = Worker(
        slug="leaky",
        display_name="leaky",
        litellm_model="openai/gpt-4o-mini",
        vendor="openai",
        api_key_env=name,
        input_usd_per_mtok=1,
        output_usd_per_mtok=1,
    )
    with pytest.raises(ValidationError) as refused:
        worker.full_clean()  # what the admin's form runs
    assert "api_key_env" in refused.value.message_dict
    assert not Worker.objects.filter(slug="leaky").exists()
    assert not AuditEvent.objects.filter(action__startswith="worker.").exists()


def test_an_llm_conductor_cannot_name_a_server_variable_as_its_key():
    version = ConductorVersion(
        name="leaky-llm",
        backend=ConductorVersion.Backend.LLM,
        config={"model": "hosted_vllm/x", "api_base": "http://127.0.0.1:9/v1", "api_key_env": "DATABASE_URL"},
    )
    with pytest.raises(ValidationError) as refused:
        version.full_clean()
    assert "cannot hold an API key" in " ".join(refused.value.message_dict["config"])


def test_allowed_names_are_the_prefix_and_the_configured_list(settings):
    settings.CONDUCTOR_KEY_ENV_ALLOW = ["OPENAI_API_KEY"]
    for name in ("CONDUCTOR_KEY_ACME", "CONDUCTOR_KEY_OPENAI_2", "OPENAI_API_KEY", ""):
        worker, _ = worker_register(
            slug="ok-" + (name.lower().replace("_", "-") or "none"),
            litellm_model="openai/gpt-4o-mini",
            vendor="openai",
            api_key_env=name,
            actor=_service(),
        )
        assert worker.api_key_env == name


def test_a_key_reference_stored_behind_the_apps_back_is_never_sent(live_pool, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://admin:hunter2-very-secret@db/prod")
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("answer")])
    Worker.objects.filter(slug="alpha").update(api_key_env="DATABASE_URL")  # no validation on this path

    run = run_now(submit())

    assert server.requests_for("alpha") == [], "the worker was called with a server variable as its key"
    assert run.status == RunStatus.FAILED and run.stop_reason == "key_not_allowed"
    attempt = Attempt.objects.get(step__run=run)
    assert attempt.status == Attempt.Status.CLIENT_ERROR
    assert "'DATABASE_URL' cannot hold an API key" in attempt.error
    assert "hunter2" not in run_record(run)


def test_an_llm_conductor_with_a_server_variable_is_not_called(live_pool, monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "django-insecure-0123456789-very-secret")
    conductor = live_pool["conductor"]
    ConductorVersion.objects.filter(pk=conductor.pk).update(
        config={**conductor.config, "api_key_env": "DJANGO_SECRET_KEY"}
    )
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])

    run = run_now(submit())

    assert server.requests_for("conductor") == []
    assert run.status == RunStatus.FAILED and run.stop_reason == "conductor_unavailable"
    assert "cannot hold an API key" in run.error


def test_an_allowed_key_is_sent_as_the_bearer_token(live_pool, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_KEY_ACME", KEY)
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("answer")])
    Worker.objects.filter(slug="alpha").update(api_key_env="CONDUCTOR_KEY_ACME")

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert server.requests_for("alpha")[0].headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("status", [401, 500])
def test_a_provider_echoing_the_key_leaves_no_key_in_the_record(live_pool, monkeypatch, status):
    monkeypatch.setenv("CONDUCTOR_KEY_ACME", KEY)
    echo = (
        f"Incorrect API key provided: {KEY}. Request headers: Authorization: Bearer {KEY}; "
        "also seen: sk-proj-AAAAAAAAAAAAAAAAAAAAAAAA, api_key=hunter2hunter2 " + "x" * 10_000
    )
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program(
        "alpha", [Reply(status=status, raw_body=json.dumps({"error": {"message": echo}}).encode())]
    )
    Worker.objects.filter(slug="alpha").update(api_key_env="CONDUCTOR_KEY_ACME")

    run = run_now(submit())

    assert run.status == RunStatus.FAILED
    record = run_record(run)
    for secret in (KEY, "sk-proj-AAAA", "hunter2hunter2"):
        assert secret not in record
    attempts = list(Attempt.objects.filter(step__run=run))
    assert attempts and all(REDACTED in a.error and len(a.error) <= MAX_ERROR_CHARS for a in attempts)
    assert AuditEvent.objects.filter(
        correlation_id=run.correlation_id, action="attempt.failed"
    ).count() == len(attempts)


def test_a_conductor_endpoint_echoing_its_key_leaves_no_key_in_the_record(live_pool, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_KEY_VLLM", KEY)
    conductor = live_pool["conductor"]
    ConductorVersion.objects.filter(pk=conductor.pk).update(
        config={**conductor.config, "api_key_env": "CONDUCTOR_KEY_VLLM"}
    )
    server = live_pool["server"]
    body = json.dumps({"error": {"message": f"upstream rejected token {KEY}"}}).encode()
    server.program("conductor", [Reply(status=500, raw_body=body)])

    run = run_now(submit())

    assert run.status == RunStatus.FAILED and run.stop_reason == "conductor_unavailable"
    assert server.requests_for("conductor")[0].headers["authorization"] == f"Bearer {KEY}"
    assert AuditEvent.objects.filter(
        correlation_id=run.correlation_id, action="conductor.call_failed"
    ).exists()
    assert KEY not in run_record(run)


def test_changing_a_workers_endpoint_or_key_reference_is_its_own_audit_event():
    worker_register(slug="w", litellm_model="openai/gpt-4o-mini", vendor="openai", actor=_service())
    worker_register(
        slug="w",
        litellm_model="openai/gpt-4o-mini",
        vendor="openai",
        api_base="https://proxy.example/v1",
        api_key_env="CONDUCTOR_KEY_W",
        actor=_service(),
    )
    event = AuditEvent.objects.get(action="worker.endpoint_changed")
    assert event.payload["api_base"] == {"from": "", "to": "https://proxy.example/v1"}
    assert event.payload["api_key_env"] == {"from": "", "to": "CONDUCTOR_KEY_W"}


@pytest.mark.parametrize(
    "text, secret",
    [
        ("Authorization: Bearer abcdefghijklmnop1234", "abcdefghijklmnop1234"),
        ("bad key sk-ant-api03-0123456789abcdefghij", "sk-ant-api03-0123456789abcdefghij"),
        ('{"api_key": "s3cr3t-value-123"}', "s3cr3t-value-123"),
        ("x-api-key=zzzzzzzzzz", "zzzzzzzzzz"),
        (
            "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXBhcnQ",
            "eyJhbGciOiJIUzI1NiJ9",
        ),
        ("AWS AKIAABCDEFGHIJKLMNOP denied", "AKIAABCDEFGHIJKLMNOP"),
    ],
)
def test_redact_replaces_token_shapes(text, secret):
    assert secret not in redact(text)
    assert REDACTED in redact(text)


def test_redact_keeps_ordinary_provider_errors_readable_and_caps_them():
    message = "RateLimitError: 429 Too Many Requests: rate limit reached for gpt-4o-mini, retry in 2s"
    assert redact(message) == message
    assert len(redact("y" * 50_000)) == MAX_ERROR_CHARS


def test_redact_replaces_the_servers_known_secrets(monkeypatch, settings):
    monkeypatch.setenv("CONDUCTOR_KEY_OTHER", "other-vendor-key-9876")
    settings.SECRET_KEY = "the-django-secret-key-for-this-test"
    text = redact("echo: other-vendor-key-9876 and the-django-secret-key-for-this-test")
    assert "other-vendor-key-9876" not in text and "the-django-secret-key" not in text


def _service():
    from audit.services import Actor

    return Actor.service("test")


def test_no_key_is_none_never_the_vendors_variable_of_the_server(live_pool, monkeypatch):
    """Given no key, litellm would read OPENAI_API_KEY from the server's environment."""
    server = live_pool["server"]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-server-owned-0123456789abcdef")
    monkeypatch.setenv("OPENAI_API_BASE", server.base_url)  # litellm's own fallback for the endpoint
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("answer")])
    Worker.objects.filter(slug="alpha").update(api_base="", api_key_env="")

    run = run_now(submit())

    assert run.status == RunStatus.SUCCEEDED, run.error
    sent = server.requests_for("alpha")[0].headers["authorization"]
    assert "sk-server-owned" not in sent and sent == "Bearer none"


def test_a_conductor_config_cannot_hold_a_key_itself():
    version = ConductorVersion(
        name="literal-key",
        backend=ConductorVersion.Backend.LLM,
        config={"model": "hosted_vllm/x", "api_key": "sk-live-0123456789abcdef"},
    )
    with pytest.raises(ValidationError) as refused:
        version.full_clean()
    assert "name its variable in api_key_env" in " ".join(refused.value.message_dict["config"])
