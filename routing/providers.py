"""Every model call goes through litellm: one code path for hosted APIs, vLLM and the replay pool.

`replay/<model>` is a litellm custom provider answering from recorded outcomes of real models.
Errors are classified once, here, into the statuses an Attempt records.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
import litellm
import openai
from django.conf import settings
from litellm.llms.custom_llm import CustomLLM, CustomLLMError
from litellm.types.utils import ModelResponse
from litellm.utils import custom_llm_setup

from . import replay
from .models import Attempt, StopReason
from .secrets import KeyNotAllowed, api_key_of, redact

REPLAY_PROVIDER = "replay"

# ProviderCallError.code, and the run's stop reason: the replay pool cannot answer this; the key
# reference is outside the allow-list.
NO_RECORDED_ANSWER = StopReason.NO_RECORDED_ANSWER
KEY_NOT_ALLOWED = StopReason.KEY_NOT_ALLOWED
NO_RECORDED_ANSWER_MESSAGE = (
    "replay pool: no recorded answer for this text; the offline pool only answers the benchmark items "
    "it recorded (pick a sample task on the submit page)"
)


class ReplayNoRecording(CustomLLMError):
    """The replay pool has no recorded answer for the request: an intended outcome, not an outage.

    Raised inside litellm's call and found again on the exception chain by classify(), which turns it
    into a non-retryable ProviderCallError carrying this plain message and the NO_RECORDED_ANSWER code.
    """

    def __init__(self, message: str):
        super().__init__(status_code=404, message=message)
        self.plain_message = message


class ReplayProvider(CustomLLM):
    """Answers a benchmark item with the response the named model really gave."""

    def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        litellm_params = kwargs.get("litellm_params") or {}
        metadata = litellm_params.get("metadata") or {}
        texts = [m.get("content") or "" for m in messages if isinstance(m.get("content"), str)]
        item = replay.find_item(item_id=metadata.get("replay_item"), texts=texts)
        if item is None:
            raise ReplayNoRecording(NO_RECORDED_ANSWER_MESSAGE)
        outcome = item.outcomes.get(model)
        if outcome is None:
            raise ReplayNoRecording(
                f"replay pool: {model} has no recorded answer for benchmark item {item.id}; "
                "give this step to a model of the pool that has one"
            )
        delay = settings.CONDUCTOR_REPLAY_LATENCY_S
        if delay:
            time.sleep(delay)
        sent_tokens = litellm.token_counter(model="gpt-4o", messages=messages)
        # The recorded prompt is the benchmark's; context added by a workflow makes it longer.
        prompt_tokens = max(int(outcome["prompt_tokens"]), sent_tokens)
        completion_tokens = int(outcome["completion_tokens"])
        model_response: ModelResponse = kwargs["model_response"]
        model_response.model = f"{REPLAY_PROVIDER}/{model}"
        model_response.choices[0].message.content = replay.response_text(outcome["response"])  # type: ignore[union-attr]
        model_response.usage = litellm.Usage(  # type: ignore[attr-defined]
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        model_response.id = f"replay-{uuid.uuid4().hex[:12]}"
        return model_response


_replay_provider = ReplayProvider()


def register_litellm_providers() -> None:
    if not any(p.get("provider") == REPLAY_PROVIDER for p in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": REPLAY_PROVIDER, "custom_handler": _replay_provider})
        custom_llm_setup()
    litellm.suppress_debug_info = True
    litellm.drop_params = True  # a provider that lacks an optional parameter ignores it


@dataclass
class Completion:
    text: str
    input_tokens: int
    output_tokens: int
    request_id: str
    raw: Any = field(repr=False, default=None)


class ProviderCallError(Exception):
    def __init__(
        self,
        status: str,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
        code: str = "",
    ):
        super().__init__(message)
        self.status = status
        self.http_status = http_status
        self.retry_after = retry_after
        self.code = code  # a known, intended outcome (NO_RECORDED_ANSWER); "" for ordinary failures

    @property
    def retryable(self) -> bool:
        if self.code:
            return False  # asking again gets the same answer
        return self.status in {
            Attempt.Status.TIMEOUT,
            Attempt.Status.RATE_LIMITED,
            Attempt.Status.SERVER_ERROR,
            Attempt.Status.MALFORMED,
        }


def _retry_after(exc: Exception) -> float | None:
    """Seconds from a Retry-After header (litellm keeps the provider's headers on the exception)."""
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        value = headers.get("retry-after") if hasattr(headers, "get") else None
        if value is not None:
            try:
                return max(0.0, float(value))
            except ValueError:
                return None  # an HTTP date: fall back to exponential backoff
    return None


def _replay_no_recording(exc: BaseException) -> ReplayNoRecording | None:
    """The replay provider's own exception, kept by litellm on the chain of the one it raises."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if isinstance(current, ReplayNoRecording):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(found) < 12:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _sent_status(chain: list[BaseException]) -> int | None:
    """The HTTP status the provider really answered, if an answer came: from the HTTP client's own
    error on the chain, never the status litellm gives its exception types (408 for a client-side
    timeout, 500 for an answer it could not parse)."""
    for exc in chain:
        if type(exc).__module__.startswith("litellm"):
            continue  # litellm's types subclass openai's, with a status of its own choosing
        if isinstance(exc, httpx.HTTPStatusError | openai.APIStatusError):
            return exc.response.status_code
    return None


# A 500 whose message says the request did not validate (pydantic's words, as servers built on it
# answer), not that the server failed.
_REFUSAL = re.compile(r"\bvalidation errors? for\b|\bvalidation error\b", re.IGNORECASE)


def classify(exc: Exception, *, secrets: tuple[str | None, ...] = ()) -> ProviderCallError:
    """The attempt status of a failed call: the kind of failure, and the status the provider sent (if
    any). Its message is redacted (`secrets`: the keys the call sent) and capped before anything can
    store it: providers echo requests, keys included."""
    no_recording = _replay_no_recording(exc)
    if no_recording is not None:
        # Shown as is: no litellm exception names, no retries (the pool would answer the same).
        return ProviderCallError(
            Attempt.Status.NO_RECORDING, redact(no_recording.plain_message), code=NO_RECORDED_ANSWER
        )
    chain = _chain(exc)
    sent = _sent_status(chain)
    message = redact(f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}", secrets)
    if isinstance(exc, litellm.Timeout) or any(isinstance(e, httpx.TimeoutException) for e in chain):
        return ProviderCallError(Attempt.Status.TIMEOUT, message, http_status=sent)
    if sent is None and any(isinstance(e, json.JSONDecodeError) for e in chain):
        return ProviderCallError(Attempt.Status.MALFORMED, f"malformed answer: {message}")
    status_code = sent or getattr(exc, "status_code", None)
    if isinstance(exc, litellm.RateLimitError) or status_code == 429:
        return ProviderCallError(
            Attempt.Status.RATE_LIMITED, message, http_status=sent, retry_after=_retry_after(exc)
        )
    if isinstance(exc, litellm.APIConnectionError) and not sent:
        return ProviderCallError(Attempt.Status.SERVER_ERROR, message)
    if isinstance(status_code, int) and status_code >= 500 and _REFUSAL.search(message):
        # A server that answers a request it cannot take with a 500 (llama.cpp's server does, for a
        # schema in another dialect): a refusal, which asking again would only repeat.
        return ProviderCallError(Attempt.Status.CLIENT_ERROR, f"refused: {message}", http_status=sent)
    if isinstance(status_code, int) and status_code >= 500:
        return ProviderCallError(Attempt.Status.SERVER_ERROR, message, http_status=sent)
    if isinstance(status_code, int) and 400 <= status_code < 500:
        return ProviderCallError(Attempt.Status.CLIENT_ERROR, message, http_status=sent)
    return ProviderCallError(Attempt.Status.ERROR, message, http_status=sent)


def endpoint_api_key(key_env: str) -> str:
    """The key named by a worker's or conductor's `key_env` (only an allowed variable: routing.secrets).
    A name outside the allow-list fails the call, unmade. No key (none named, or its variable unset) is
    "none", never None: given None, litellm would send the vendor's own variable from the server's
    environment (OPENAI_API_KEY...), a key nobody allowed."""
    try:
        key = api_key_of(key_env)
    except KeyNotAllowed as exc:
        raise ProviderCallError(Attempt.Status.CLIENT_ERROR, str(exc), code=KEY_NOT_ALLOWED) from exc
    return key or "none"


def worker_api_key(worker: Any) -> str:
    return endpoint_api_key(worker.api_key_env)


def complete(
    *,
    model: str,
    messages: list[dict[str, Any]],
    api_base: str = "",
    api_key: str | None = None,
    timeout: float | None = None,
    metadata: dict[str, Any] | None = None,
    **params: Any,
) -> Completion:
    """One provider call, no retries (the engine retries so that each attempt is recorded)."""
    response = _litellm(
        litellm.completion,
        model=model,
        messages=messages,
        api_base=api_base,
        api_key=api_key,
        timeout=timeout,
        metadata=metadata or {},
        **params,
    )
    if not getattr(response, "choices", None):
        raise ProviderCallError(
            Attempt.Status.MALFORMED, "malformed answer: the provider answered with no choices"
        )
    choice = response.choices[0]
    text = choice.message.content or ""
    usage = getattr(response, "usage", None)
    return Completion(
        text=text,
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        request_id=str(getattr(response, "id", "") or ""),
        raw=response,
    )


def complete_prompt(
    *,
    model: str,
    prompt: str,
    api_base: str = "",
    api_key: str | None = None,
    timeout: float | None = None,
    **params: Any,
) -> Any:
    """One plain-text completion (a prompt already in the model's chat template), no retries: the
    response as litellm gives it. For what the chat protocol cannot ask, such as the next token's
    probabilities after a given prefix."""
    return _litellm(
        litellm.text_completion,
        model=model,
        prompt=prompt,
        api_base=api_base,
        api_key=api_key,
        timeout=timeout,
        **params,
    )


def _litellm(call: Any, *, api_base: str, api_key: str | None, timeout: float | None, **params: Any) -> Any:
    """One litellm call, never retried by litellm; its failure classified (the key redacted)."""
    try:
        return call(
            api_base=api_base or None,
            api_key=api_key,
            timeout=timeout or settings.CONDUCTOR_PROVIDER_TIMEOUT_S,
            num_retries=0,
            max_retries=0,
            **params,
        )
    except Exception as exc:  # litellm maps every provider failure onto its exception types
        raise classify(exc, secrets=(api_key,)) from exc


@dataclass(frozen=True)
class ModelInfo:
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    context_window: int | None


def litellm_model_info(model: str) -> ModelInfo | None:
    """Prices per 1M tokens and context window from litellm's local cost map, or None if unknown."""
    info = litellm.model_cost.get(model) or litellm.model_cost.get(model.split("/", 1)[-1])
    if not info or info.get("input_cost_per_token") is None:
        return None
    per_m = Decimal(1_000_000)
    # str() first: the map holds floats, and Decimal(float) would carry binary noise into prices.
    return ModelInfo(
        input_usd_per_mtok=(Decimal(str(info["input_cost_per_token"])) * per_m),
        output_usd_per_mtok=(Decimal(str(info.get("output_cost_per_token") or 0)) * per_m),
        context_window=info.get("max_input_tokens") or info.get("max_tokens"),
    )
