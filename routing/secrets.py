"""API keys: where they may come from, and keeping them out of everything the app stores.

A worker (or an LLM conductor) names the environment variable that holds its key. Only variables
meant for keys may be named: `CONDUCTOR_KEY_<NAME>`, or one listed in CONDUCTOR_KEY_ENV_ALLOW. Anything
else (DATABASE_URL, DJANGO_SECRET_KEY...) is refused when the worker is saved and again when a call
would read it, so that whoever may edit a worker cannot have the server send its own secrets to an
endpoint of their choosing.

Provider error text is redacted before it is stored anywhere (attempt rows, audit events, run errors):
the key sent with the call, every allowed key variable's value and the server's secret key are
replaced, as is anything shaped like a bearer token or a vendor key; the text is then capped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from django.conf import settings
from django.core.exceptions import ValidationError

# A worker's fields that decide where its data and which key go (the model string's prefix picks the
# provider): changed by admins only, each change its own audit event (worker.endpoint_changed).
ENDPOINT_FIELDS = ("litellm_model", "api_base", "api_key_env")
# Other variables whose values are secrets a provider could echo (vendor keys litellm knows, URLs with
# passwords): redacted from error text too, though never sent.
_SECRET_NAMES = re.compile(r".*(API_KEY|_TOKEN|_SECRET|SECRET_KEY|PASSWORD|_URL)$")
# Config entries that would hold a key itself rather than the name of its variable.
SECRET_CONFIG_KEYS = frozenset({"api_key", "key", "token", "secret", "password", "authorization"})
KEY_ENV_PREFIX = "CONDUCTOR_KEY_"
KEY_ENV_PATTERN = re.compile(r"CONDUCTOR_KEY_[A-Z0-9_]{1,80}")
MAX_ERROR_CHARS = 2000
REDACTED = "[redacted]"
# Shorter values are not treated as secrets: replacing them would mangle ordinary words.
MIN_SECRET_CHARS = 8

_SHAPES = [
    # Authorization schemes: "Bearer abc...", "Token abc...", "Basic abc..."
    (re.compile(r"(?i)\b(bearer|token|basic)(\s+)[A-Za-z0-9\-._~+/]{8,}=*"), r"\1\2" + REDACTED),
    # key=value and "key": "value" pairs whose name says secret
    (
        re.compile(
            r"(?i)((?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password|authorization)"
            r"[\"']?\s*[:=]\s*[\"']?)(?!\[redacted\])[^\s\"',;}]{6,}"
        ),
        r"\1" + REDACTED,
    ),
    # Vendor key shapes: OpenAI/Anthropic-style sk-..., Google AIza..., GitHub, Slack, AWS access keys, JWTs
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{16,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z\-_]{30,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), REDACTED),
]


def key_env_allowed(name: str) -> bool:
    return bool(KEY_ENV_PATTERN.fullmatch(name)) or name in settings.CONDUCTOR_KEY_ENV_ALLOW


def key_env_check(name: str) -> None:
    """Validator of a key reference (Worker.api_key_env, an LLM conductor's config): "" means no key."""
    if name and not key_env_allowed(name):
        raise ValidationError(
            f"{name!r} cannot hold an API key: keys are read only from environment variables named "
            f"{KEY_ENV_PREFIX}<NAME> (capitals, digits, '_') or listed in CONDUCTOR_KEY_ENV_ALLOW",
            code="key_env_not_allowed",
        )


class KeyNotAllowed(ValueError):
    """A stored key reference names a variable outside the allow-list (saved before the rule, or behind
    the app's back): the call is not made."""


def api_key_of(name: str) -> str | None:
    """The value of an allowed key variable; None when unset or no name is given."""
    if not name:
        return None
    try:
        key_env_check(name)
    except ValidationError as exc:
        raise KeyNotAllowed(exc.messages[0]) from exc
    return os.environ.get(name) or None


def known_secrets() -> list[str]:
    """Every secret the server holds that a provider could echo: allowed key values, the secret key."""
    values = [
        value for name, value in os.environ.items() if key_env_allowed(name) or _SECRET_NAMES.match(name)
    ]
    values.append(settings.SECRET_KEY)
    return values


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with `secrets`, the server's known secrets and bearer-token shapes replaced, capped."""
    found = {s for s in (*secrets, *known_secrets()) if s and len(s) >= MIN_SECRET_CHARS}
    for secret in sorted(found, key=len, reverse=True):  # a longer secret may contain a shorter one
        text = text.replace(secret, REDACTED)
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return text
