"""The LLM conductor: a model behind the OpenAI protocol (vLLM, any provider litellm speaks) writes the
workflow. Its prompt is built here and only here (`LLMConductor.messages`): the engine's plans and
training's GRPO prompts both go through it.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ..plans import MAX_STEPS, workflow_schema
from ..providers import ProviderCallError, complete, complete_prompt, endpoint_api_key
from .base import PlanRequest, Proposal, elapsed_ms

SYSTEM_PROMPT = """You are the conductor of a team of language models. Read the task and write a short \
workflow: which worker gets which subtask, and which earlier results each step may see.

Answer with one JSON object and nothing else:
{{"thought": "<one or two sentences>", "steps": [{{"worker": "<worker id>", "instruction": "<subtask>", "access": "all" or [indices of earlier steps]}}]}}

Rules:
- At most {max_steps} steps. The final answer is the last step's response.
- A step may only see earlier steps: "access" is "all" or a list of smaller indices ([] for none).
- Workers see only their instruction and the steps in their access list: put everything a worker needs
  in its instruction (quote the task when the worker must solve it).
- Prefer cheap workers when they are likely to be right; add a checking step only when it pays.
{recursion_rule}
Workers (USD per 1M input / output tokens):
{workers}
"""


RECURSION_RULE = (
    '- "conductor" is you: a step given to "conductor" lets you look at the results so far and plan more '
    "steps, or pass the last response through.\n"
)


FEW_SHOT = [
    {
        "task": "What is 17 * 24?",
        "plan": {
            "thought": "Simple arithmetic; one cheap worker suffices.",
            "steps": [
                {"worker": "{cheap}", "instruction": "Compute 17 * 24. End with the number.", "access": []}
            ],
        },
    },
    {
        "task": "Prove that the sum of two odd integers is even, then give a short numeric example.",
        "plan": {
            "thought": "A strong worker writes the proof; a cheap one checks it.",
            "steps": [
                {
                    "worker": "{strong}",
                    "instruction": "Prove that the sum of two odd integers is even, with a numeric example.",
                    "access": [],
                },
                {
                    "worker": "{cheap}",
                    "instruction": "Check the proof above for errors and restate it correctly.",
                    "access": "all",
                },
            ],
        },
    },
]


INLINE, PROBE, NONE = "inline", "probe", "none"  # where the alternatives come from (config['alternatives'])

# How each server takes the workflow's JSON schema as constrained output (config['schema_dialect']).
VLLM, OPENAI, LLAMA_CPP = "vllm", "openai", "llama.cpp"
SCHEMA_DIALECTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    # vLLM >= 0.12 reads structured_outputs (guided_json is ignored there), and the OpenAI form too.
    VLLM: lambda schema: {
        "response_format": {"type": "json_schema", "json_schema": {"name": "workflow", "schema": schema}},
        "extra_body": {"structured_outputs": {"json": schema}},
    },
    OPENAI: lambda schema: {
        "response_format": {"type": "json_schema", "json_schema": {"name": "workflow", "schema": schema}}
    },
    # llama.cpp's server: its own form (it refuses OpenAI's json_schema type with a 500).
    LLAMA_CPP: lambda schema: {"response_format": {"type": "json_object", "schema": schema}},
}


class LLMConductor:
    """Asks a model for the workflow, with the workflow's JSON schema as a structured-output constraint."""

    def __init__(self, config: dict[str, Any]):
        if not config.get("model"):
            raise ValueError("an llm conductor needs config['model'], e.g. hosted_vllm/conductor")
        self.model = config["model"]
        self.api_base = config.get("api_base", "")
        self.api_key_env = config.get("api_key_env", "")
        self.temperature = float(config.get("temperature", 0.0))
        self.max_tokens = int(
            config.get("max_tokens", 1024)
        )  # the paper caps conductor output at 1,024 tokens
        self.top_logprobs = int(config.get("top_logprobs", 5))
        # Where the alternatives come from (config['alternatives']): "inline", the log-probabilities of
        # every token of the answer (vLLM: cheap); "probe", after the answer, one single-token
        # completion per worker it named, on its own prefix (llama.cpp's server sorts the vocabulary in
        # Python for each token it gives log-probabilities of: 0.1 s a token, 16 s for a plan that takes
        # 2.5 s without them); "none".
        self.alternatives = str(config.get("alternatives", INLINE))
        if self.alternatives not in (INLINE, PROBE, NONE) or (
            self.alternatives != NONE and self.top_logprobs < 1
        ):
            raise ValueError(
                "config['alternatives'] is inline, probe or none (inline and probe need top_logprobs >= 1)"
            )
        self.schema_dialect = str(config.get("schema_dialect", VLLM))
        if self.schema_dialect not in SCHEMA_DIALECTS:
            raise ValueError(
                f"config['schema_dialect'] is one of {', '.join(SCHEMA_DIALECTS)}, not {self.schema_dialect!r}"
            )
        # A small model on a CPU writes long plans slowly: caps on its steps and its texts, in the schema.
        self.max_plan_steps = int(config.get("max_plan_steps") or MAX_STEPS)
        self.max_text_chars = int(config["max_text_chars"]) if config.get("max_text_chars") else None
        self.input_usd_per_mtok = Decimal(str(config.get("input_usd_per_mtok", "0")))
        self.output_usd_per_mtok = Decimal(str(config.get("output_usd_per_mtok", "0")))

    def steps_allowed(self, request: PlanRequest) -> int:
        return min(request.max_steps, self.max_plan_steps)

    def messages(self, request: PlanRequest) -> list[dict[str, str]]:
        workers = "\n".join(
            f"- {w.slug} ({w.vendor}; ${_usd(w.input_usd_per_mtok)} / ${_usd(w.output_usd_per_mtok)})"
            + (f": {w.description}" if w.description else "")
            for w in request.workers
        )
        system = SYSTEM_PROMPT.format(
            max_steps=self.steps_allowed(request),
            recursion_rule=RECURSION_RULE if request.may_recurse else "",
            workers=workers,
        )
        by_price = sorted(request.workers, key=lambda w: w.input_usd_per_mtok + w.output_usd_per_mtok)
        cheap, strong = by_price[0].slug, by_price[-1].slug
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        for shot in FEW_SHOT:
            plan = json.loads(json.dumps(shot["plan"]).replace("{cheap}", cheap).replace("{strong}", strong))
            messages += [
                {"role": "user", "content": f"Task:\n{shot['task']}"},
                {"role": "assistant", "content": json.dumps(plan)},
            ]
        user = f"Task:\n{request.task_text}"
        if request.is_inner:
            user += (
                "\n\nYou were called as a step of this plan:\n"
                + json.dumps(request.parent_plan)
                + "\n\nThe last response so far:\n"
                + request.last_response
                + '\n\nPlan further steps, or answer {"thought": "...", "steps": []} to pass that response through.'
            )
        if request.feedback:
            user += f"\n\nYour previous answer was rejected: {request.feedback}\nAnswer again with a valid workflow."
        messages.append({"role": "user", "content": user})
        return messages

    def propose(self, request: PlanRequest) -> Proposal:
        messages = self.messages(request)
        schema = workflow_schema(
            request.allowed_slugs,
            max_steps=self.steps_allowed(request),
            min_steps=0 if request.is_inner else 1,
            max_text_chars=self.max_text_chars,
        )
        started = time.monotonic()
        params: dict[str, Any] = dict(SCHEMA_DIALECTS[self.schema_dialect](schema))
        if request.temperature is not None and request.seed is not None:
            params["seed"] = request.seed
        if self.alternatives == INLINE:
            params.update(logprobs=True, top_logprobs=self.top_logprobs)
        completion = complete(
            model=self.model,
            messages=messages,
            api_base=self.api_base,
            api_key=endpoint_api_key(self.api_key_env),
            temperature=self.temperature if request.temperature is None else request.temperature,
            max_tokens=self.max_tokens,
            **params,
        )
        if self.alternatives == INLINE:
            alternatives = worker_alternatives(completion.raw, request.allowed_slugs)
        elif self.alternatives == PROBE:
            alternatives = self.probed_alternatives(messages, completion.text, request.allowed_slugs)
        else:
            alternatives = []
        latency_ms = elapsed_ms(started)
        cost = (
            Decimal(completion.input_tokens) * self.input_usd_per_mtok
            + Decimal(completion.output_tokens) * self.output_usd_per_mtok
        ) / Decimal(1_000_000)
        return Proposal(
            raw_output=completion.text,
            prompt=messages,
            alternatives=alternatives,
            input_tokens=completion.input_tokens,
            output_tokens=completion.output_tokens,
            cost_usd=cost,
            latency_ms=latency_ms,
        )

    def probed_alternatives(
        self, messages: list[dict[str, str]], answer: str, slugs: list[str]
    ) -> list[dict[str, Any]]:
        """For each "worker" value of the answer, the model's next-token probabilities where that value
        begins: the answer's own prefix completed by one token. The server keeps the prompt's state
        from the plan's call, so a probe evaluates one token, but llama.cpp's server still takes the
        log-softmax of every position it holds: about 0.6 s a probe on a 700-token prompt on 2 cores.
        None when a probe fails: they explain a plan, they are not the plan."""
        prompt = chatml(messages)
        result: list[dict[str, Any]] = []
        for match in _WORKER_VALUE.finditer(answer):
            try:
                response = complete_prompt(
                    model=self.model,
                    prompt=prompt + answer[: match.end()],
                    api_base=self.api_base,
                    api_key=endpoint_api_key(self.api_key_env),
                    max_tokens=1,
                    temperature=0.0,
                    logprobs=self.top_logprobs,
                )
                tops = response.choices[0].logprobs.top_logprobs[0]
            except (ProviderCallError, AttributeError, IndexError, TypeError):
                return []
            ranked = sorted(tops.items(), key=lambda top: -top[1])
            result.append({"step": len(result), "candidates": [_candidate(t, lp, slugs) for t, lp in ranked]})
        return result


def _usd(price: Decimal) -> str:
    """A price as few tokens say it: 3, 0.075, 0 (not 3.0000000000, 0E-10)."""
    return format(price.normalize(), "f")


def chatml(messages: list[dict[str, str]]) -> str:
    """The messages in ChatML, the chat template of SmolLM2 and Qwen, as their servers render them
    (the prompt a probe continues: the same text, so the server reuses the state it kept)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def _candidate(token: str, logprob: float, slugs: list[str]) -> dict[str, Any]:
    """A token the model weighed, its probability, and the worker names it begins."""
    workers = [s for s in slugs if s.startswith(token)] if token else []
    return {"token": token, "p": round(math.exp(logprob), 6), "workers": workers}


_WORKER_KEY = re.compile(r'"worker"\s*:\s*"$')
_WORKER_VALUE = re.compile(r'"worker"\s*:\s*"')


def worker_alternatives(response: Any, slugs: list[str]) -> list[dict[str, Any]]:
    """For each "worker" value the model wrote, the candidates it weighed and their probabilities.

    Read from the token log-probabilities at the first token of each worker name; a candidate token
    is mapped to the worker names it begins.
    """
    try:
        content = (
            response.choices[0].logprobs["content"]
            if isinstance(response.choices[0].logprobs, dict)
            else response.choices[0].logprobs.content
        )
    except (AttributeError, IndexError, KeyError, TypeError):
        return []
    if not content:
        return []
    result: list[dict[str, Any]] = []
    text = ""
    for entry in content:
        token = entry["token"] if isinstance(entry, dict) else entry.token
        tops = entry.get("top_logprobs") if isinstance(entry, dict) else entry.top_logprobs
        if _WORKER_KEY.search(text) and tops:
            candidates = []
            for top in tops:
                top_token = top["token"] if isinstance(top, dict) else top.token
                logprob = top["logprob"] if isinstance(top, dict) else top.logprob
                candidates.append(_candidate(top_token, logprob, slugs))
            result.append({"step": len(result), "candidates": candidates})
        text += token
    return result
