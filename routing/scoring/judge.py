"""The LLM-judge scorer: a worker model says whether a final answer matches the reference.

The judge is a registered worker (CONDUCTOR_JUDGE_WORKER), called through litellm like any other, and
held to the same data policies: it sees the task, the reference and the answer, so a judge that may not
receive the task's data class is not asked (the run gets no score, and the reason is recorded).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings

from audit import policies

from ..hashing import content_hash
from ..models import Worker
from ..providers import ProviderCallError, complete, worker_api_key
from .scorers import extract_answer

PROMPT = """You grade answers. Compare the candidate's final answer with the reference answer to the \
task below. Equivalent forms count as the same answer (2/4 = 0.5 = 1/2; "x=3" = "3").
Reply with exactly one word: CORRECT or INCORRECT.

Task:
{task}

Reference answer:
{reference}

Candidate's final answer:
{answer}
"""

_VERDICT = re.compile(r"\b(INCORRECT|CORRECT)\b", re.IGNORECASE)


@dataclass
class Judgement:
    score: float | None
    answer: str
    worker: str = ""
    vendor: str = ""
    verdict: str = ""
    reason: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal("0")
    latency_ms: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    def audit_payload(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "vendor": self.vendor,
            "verdict": self.verdict,
            "score": self.score,
            "reason": self.reason,
            "cost_usd": self.cost_usd,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "latency_ms": self.latency_ms,
            "messages_sha256": content_hash(self.messages) if self.messages else "",
        }


def judge(*, task_text: str, reference: str, response: str, classification: str) -> Judgement:
    answer = extract_answer(response)
    slug = settings.CONDUCTOR_JUDGE_WORKER
    if not slug:
        return Judgement(None, answer, reason="no judge worker is configured (CONDUCTOR_JUDGE_WORKER)")
    worker = Worker.objects.filter(slug=slug, enabled=True).first()
    if worker is None:
        return Judgement(
            None, answer, worker=slug, reason=f"judge worker {slug!r} is not registered or disabled"
        )
    verdict = policies.judge(worker, classification, policies.active_rules())
    if not verdict.allowed:
        return Judgement(
            None, answer, worker=slug, vendor=worker.vendor, reason=f"policy {verdict.rule}: {verdict.reason}"
        )
    messages = [
        {
            "role": "user",
            "content": PROMPT.format(task=task_text, reference=reference, answer=answer or response),
        }
    ]
    started = time.monotonic()
    try:
        completion = complete(
            model=worker.litellm_model,
            messages=messages,
            api_base=worker.api_base,
            api_key=worker_api_key(worker),
            temperature=0.0,
            max_tokens=8,
        )
    except ProviderCallError as exc:
        return Judgement(
            None,
            answer,
            worker=slug,
            vendor=worker.vendor,
            reason=f"judge call failed: {exc}",
            messages=messages,
        )
    found = _VERDICT.search(completion.text)
    said = found.group(1).upper() if found else ""
    return Judgement(
        score={"CORRECT": 1.0, "INCORRECT": 0.0}.get(said),
        answer=answer,
        worker=slug,
        vendor=worker.vendor,
        verdict=said or completion.text[:200],
        reason="" if said else "the judge's reply names neither CORRECT nor INCORRECT",
        input_tokens=completion.input_tokens,
        output_tokens=completion.output_tokens,
        cost_usd=worker.cost_of(input_tokens=completion.input_tokens, output_tokens=completion.output_tokens),
        latency_ms=int((time.monotonic() - started) * 1000),
        messages=messages,
    )
