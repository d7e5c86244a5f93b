"""The llm conductor speaks each server's form of a JSON-schema constraint, chosen by its config; a
500 that says the request did not validate is a refusal, not an outage (a real loopback server)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from routing.conductors import LLMConductor, PlanRequest, WorkerCard
from routing.models import Attempt
from routing.plans import workflow_schema
from routing.providers import ProviderCallError, complete
from tests.openai_server import Reply, plan_json

WORKERS = [WorkerCard("alpha", "acme", "", Decimal("1"), Decimal("2"))]
REQUEST = PlanRequest(task_text="What is 6 * 7?", domain="", workers=WORKERS, max_steps=3, may_recurse=False)


def asked(openai_server, **config) -> dict:
    """The body of the request a conductor of this config sends."""
    openai_server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    conductor = LLMConductor({"model": "openai/conductor", "api_base": openai_server.base_url, **config})
    proposal = conductor.propose(REQUEST)
    assert proposal.raw_output == plan_json(("alpha", "Do it", []))
    chats = [r.body for r in openai_server.requests_for("conductor") if "messages" in r.body]
    return chats[-1]


def test_each_dialect_sends_the_schema_in_its_servers_form(openai_server):
    schema = workflow_schema(["alpha"], max_steps=3, min_steps=1)  # a top-level plan has a step

    vllm = asked(openai_server)  # the default: vLLM reads structured_outputs
    assert vllm["structured_outputs"] == {"json": schema}
    assert vllm["response_format"]["json_schema"]["schema"] == schema
    openai = asked(openai_server, schema_dialect="openai")
    assert "structured_outputs" not in openai
    assert openai["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "workflow", "schema": schema},
    }
    llama = asked(openai_server, schema_dialect="llama.cpp")
    assert "structured_outputs" not in llama
    assert llama["response_format"] == {"type": "json_object", "schema": schema}


def test_log_probabilities_are_asked_only_where_they_are_read(openai_server):
    assert asked(openai_server)["logprobs"] is True
    assert "logprobs" not in asked(openai_server, alternatives="none")
    # Probed alternatives are asked after the plan, one token where each worker's name begins.
    assert "logprobs" not in asked(openai_server, alternatives="probe")
    (probe,) = [r.body for r in openai_server.requests_for("conductor") if "prompt" in r.body]
    assert probe["prompt"].endswith('<|im_start|>assistant\n{"thought": "test plan", "steps": [{"worker": "')
    assert (probe["max_tokens"], probe["logprobs"]) == (1, 5)


@pytest.mark.parametrize(
    "config",
    [
        {"schema_dialect": "json_schema"},
        {"alternatives": "always"},
        {"alternatives": "probe", "top_logprobs": 0},
    ],
)
def test_a_config_the_conductor_cannot_follow_is_refused_when_it_is_built(config):
    with pytest.raises(ValueError):
        LLMConductor({"model": "openai/conductor", **config})


def test_a_500_that_says_the_request_did_not_validate_is_a_refusal(openai_server):
    refused = "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type')}"
    body = json.dumps({"error": {"message": refused, "type": "internal_server_error"}}).encode()
    openai_server.program("refuses", [Reply(status=500, raw_body=body)])
    openai_server.program("fails", [Reply(status=500)])
    messages = [{"role": "user", "content": "hi"}]

    with pytest.raises(ProviderCallError) as refusal:
        complete(model="openai/refuses", messages=messages, api_base=openai_server.base_url, api_key="none")
    with pytest.raises(ProviderCallError) as outage:
        complete(model="openai/fails", messages=messages, api_base=openai_server.base_url, api_key="none")

    assert (refusal.value.status, refusal.value.http_status) == (Attempt.Status.CLIENT_ERROR, 500)
    assert not refusal.value.retryable and str(refusal.value).startswith("refused: ")
    assert (outage.value.status, outage.value.http_status) == (Attempt.Status.SERVER_ERROR, 500)
    assert outage.value.retryable


def test_a_small_models_plan_is_capped_in_steps_and_text_by_the_schema(openai_server):
    body = asked(openai_server, max_plan_steps=2, max_text_chars=120)

    schema = body["structured_outputs"]["json"]
    steps = schema["properties"]["steps"]
    assert (steps["minItems"], steps["maxItems"]) == (1, 2)
    assert steps["items"]["properties"]["instruction"]["maxLength"] == 120
    assert schema["properties"]["thought"]["maxLength"] == 120
    assert "At most 2 steps." in body["messages"][0]["content"]
