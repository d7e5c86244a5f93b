"""Scorers: compare a final answer with a reference. Each returns 1.0 (right) or 0.0 (wrong).

An answer is first extracted from the response text: the "answer" field of a JSON object (the format
the recorded benchmark responses use), else a LaTeX \\boxed{...}, else an "answer is ..." phrase,
else the last line.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import regex as regex_engine  # matches with a timeout (the re module has none)

_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{") - 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


_ANSWER_FIELD = re.compile(r'"answer"\s*:\s*(?:"((?:[^"\\]|\\.)*)"|([^,}\n]+))')


def _json_answer(blob: str) -> str | None:
    for candidate in (blob, blob.replace("\\'", "'")):  # models often write \' which JSON does not allow
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "answer" in obj:
            return str(obj["answer"]).strip()
    return None


def extract_answer(response: str) -> str:
    text = response.strip()
    blobs = [m.group(1) for m in re.finditer(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)]
    obj_match = _JSON_OBJECT.search(text)
    if obj_match:
        blobs.append(obj_match.group(0))
    for blob in reversed(blobs):
        found = _json_answer(blob)
        if found is not None:
            return found
    fields = list(_ANSWER_FIELD.finditer(text))
    if fields:
        last = fields[-1]
        value = last.group(1) if last.group(1) is not None else last.group(2)
        try:
            return str(json.loads(f'"{value}"')).strip() if last.group(1) is not None else value.strip()
        except json.JSONDecodeError:
            return value.replace("\\'", "'").strip()
    boxed = _boxed(text)
    if boxed is not None:
        return boxed.strip()
    said = list(_ANSWER_IS.finditer(text))
    if said:
        return said[-1].group(1).strip().rstrip(".")
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _number(text: str) -> Decimal | None:
    cleaned = text.replace("$", "").replace("\\%", "").replace("%", "").strip()
    found = _NUMBER.findall(cleaned)
    if not found:
        return None
    token = found[-1].replace(",", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return Decimal(num) / Decimal(den)
        return Decimal(token)
    except (InvalidOperation, ZeroDivisionError):
        return None


def numeric(answer: str, reference: str) -> float:
    a, r = _number(answer), _number(reference)
    if a is None or r is None:
        return 0.0
    return 1.0 if abs(a - r) <= Decimal("1e-6") * max(Decimal(1), abs(r)) else 0.0


def _normalise(text: str) -> str:
    text = text.strip().strip("$").strip()
    for old, new in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("dfrac", "frac"),
        ("tfrac", "frac"),
        (" ", ""),
    ):
        text = text.replace(old, new)
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    return text.rstrip(".").lower()


def exact(answer: str, reference: str) -> float:
    return 1.0 if _normalise(answer) == _normalise(reference) else 0.0


def literal(answer: str, reference: str) -> float:
    try:
        return 1.0 if ast.literal_eval(answer.strip()) == ast.literal_eval(reference.strip()) else 0.0
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return exact(answer, reference)


def math(answer: str, reference: str) -> float:
    if exact(answer, reference):
        return 1.0
    if re.fullmatch(r"[-\d.,/\s$]+", reference.strip()):  # a plain number: compare as numbers
        return numeric(answer, reference)
    return 0.0


MAX_PATTERN_CHARS = 1000


REGEX_TIMEOUT_S = 1.0


def check_pattern(reference: str) -> Any:
    """A regex reference, compiled; ValueError with the reason when it is not a usable pattern."""
    if len(reference) > MAX_PATTERN_CHARS:
        raise ValueError(
            f"the reference pattern has {len(reference)} characters; at most {MAX_PATTERN_CHARS}"
        )
    try:
        return regex_engine.compile(reference, regex_engine.IGNORECASE)
    except regex_engine.error as exc:
        raise ValueError(f"the reference is not a valid regular expression: {exc}") from exc


def regex(answer: str, reference: str) -> float:
    """The reference is a regular expression the whole extracted answer must match (case-insensitive).

    Matched with a time limit: a pattern that backtracks without end scores 0 instead of hanging a worker.
    """
    try:
        pattern = check_pattern(reference)
        return 1.0 if pattern.fullmatch(answer.strip(), timeout=REGEX_TIMEOUT_S) else 0.0
    except (ValueError, TimeoutError):
        return 0.0


SCORERS: dict[str, Callable[[str, str], float]] = {
    "numeric": numeric,
    "exact": exact,
    "literal": literal,
    "math": math,
    "regex": regex,
}
# "judge" asks a worker model whether the answer matches the reference (routing.scoring.judge); the engine
# calls it, since it is a provider call with a vendor, a cost and an audit record of its own.
JUDGE = "judge"
DOMAIN_SCORERS = {"gsm8k": "numeric", "math-l5": "math", "cruxeval-o": "literal"}
SCORER_CHOICES = ["auto", *SCORERS, JUDGE]


def scorer_name(scorer: str, domain: str) -> str:
    if scorer != "auto":
        return scorer
    return DOMAIN_SCORERS.get(domain, "exact")


def score(*, response: str, reference: str, scorer: str = "auto", domain: str = "") -> tuple[float, str]:
    """Score a response against a reference; returns (score, extracted answer)."""
    answer = extract_answer(response)
    name = scorer_name(scorer, domain)
    return SCORERS[name](answer, reference), answer
