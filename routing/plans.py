"""The workflow format a conductor emits, its JSON schema, and its validation.

{"thought": "...", "steps": [{"worker": "<slug>", "instruction": "...", "access": "all" | [] | [0, 2]}]}

`access` names the earlier steps whose instruction and response a step may see; the final answer is
the last step's response. A plan is data, never trusted: every rule here holds whatever the model wrote.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .limits import MAX_STEPS_PER_PLAN as MAX_STEPS
from .limits import instruction_max_chars


class PlanError(ValueError):
    """The conductor's output is not a usable plan. The message is shown to the conductor on retry."""


def visible_indices(access: list[int] | str | None, index: int) -> list[int]:
    """The one rule of what a step sees: the earlier steps of its plan that its access list names
    ("all": every earlier step). The engine waits for them and sends their answers; the dossier and
    the API (a step's `sees`, which the graph draws) show the same."""
    if access == "all":
        return list(range(index))
    return sorted(set(access or []))


@dataclass(frozen=True)
class PlanStep:
    worker: str
    instruction: str
    access: list[int] | str  # "all" or indices of earlier steps

    def visible_indices(self, index: int) -> list[int]:
        return visible_indices(self.access, index)

    def as_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "instruction": self.instruction, "access": self.access}


@dataclass(frozen=True)
class Plan:
    thought: str
    steps: list[PlanStep] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"thought": self.thought, "steps": [s.as_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(
            thought=data.get("thought", ""),
            steps=[PlanStep(s["worker"], s["instruction"], s["access"]) for s in data["steps"]],
        )


def workflow_schema(
    worker_slugs: list[str],
    *,
    max_steps: int = MAX_STEPS,
    min_steps: int = 0,
    max_text_chars: int | None = None,
) -> dict[str, Any]:
    """JSON schema sent to the conductor endpoint as structured output, listing the allowed workers.
    `min_steps`: 1 where an empty plan is invalid (a top-level one). `max_text_chars`: a cap on the
    thought and each instruction, so that a small model's plan ends within its token budget."""
    text: dict[str, Any] = {"type": "string"}
    if max_text_chars is not None:
        text["maxLength"] = max_text_chars
    return {
        "type": "object",
        "properties": {
            "thought": text,
            "steps": {
                "type": "array",
                "minItems": min_steps,
                "maxItems": max_steps,
                "items": {
                    "type": "object",
                    "properties": {
                        "worker": {"type": "string", "enum": sorted(worker_slugs)},
                        "instruction": text,
                        "access": {
                            "anyOf": [
                                {"type": "string", "enum": ["all"]},
                                {"type": "array", "items": {"type": "integer", "minimum": 0}},
                            ]
                        },
                    },
                    "required": ["worker", "instruction", "access"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["thought", "steps"],
        "additionalProperties": False,
    }


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _extract_json(raw: str) -> Any:
    text = raw.strip()
    if not text:
        raise PlanError("the output is empty; answer with one JSON object")
    candidates = [text]
    fenced = _FENCE.search(text)
    if fenced:
        candidates.append(fenced.group(1).strip())
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    last_error: json.JSONDecodeError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError as exc:
            last_error = exc
    assert last_error is not None
    raise PlanError(
        f"the output is not valid JSON ({last_error.msg} at line {last_error.lineno} column {last_error.colno})"
    )


def parse_plan(
    raw: str, *, allowed_workers: set[str], max_steps: int = MAX_STEPS, allow_empty: bool = False
) -> Plan:
    """Parse and validate a conductor's raw output. Raises PlanError naming the first problem."""
    data = _extract_json(raw)
    if not isinstance(data, dict):
        raise PlanError("the output must be a JSON object with keys 'thought' and 'steps'")
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise PlanError("'steps' must be a list")
    thought = data.get("thought", "")
    if not isinstance(thought, str):
        raise PlanError("'thought' must be a string")
    if not steps and not allow_empty:
        raise PlanError("the plan has no steps; give at least one")
    if len(steps) > max_steps:
        raise PlanError(f"the plan has {len(steps)} steps; at most {max_steps} are allowed")
    parsed: list[PlanStep] = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise PlanError(f"step {i} must be an object with 'worker', 'instruction' and 'access'")
        missing = [k for k in ("worker", "instruction", "access") if k not in step]
        if missing:
            raise PlanError(f"step {i} lacks {', '.join(repr(m) for m in missing)}")
        worker, instruction, access = step["worker"], step["instruction"], step["access"]
        if not isinstance(worker, str) or worker not in allowed_workers:
            raise PlanError(
                f"step {i} names worker {worker!r}, which is not one of the allowed workers: "
                + ", ".join(sorted(allowed_workers))
            )
        if not isinstance(instruction, str) or not instruction.strip():
            raise PlanError(f"step {i} has an empty instruction")
        if len(instruction) > (longest := instruction_max_chars()):
            raise PlanError(
                f"step {i}'s instruction has {len(instruction)} characters; at most {longest} are allowed "
                "(the longest task, CONDUCTOR_MAX_TASK_CHARS, quoted whole, and its framing)"
            )
        if access != "all":
            if not isinstance(access, list) or not all(
                isinstance(a, int) and not isinstance(a, bool) for a in access
            ):
                raise PlanError(f'step {i}\'s access must be "all" or a list of earlier step indices')
            forward = [a for a in access if a < 0 or a >= i]
            if forward:
                raise PlanError(
                    f"step {i}'s access list {access} points at steps {forward}; a step may only see earlier steps (0..{i - 1})"
                    if i
                    else f"step 0's access list {access} must be empty: there are no earlier steps"
                )
        parsed.append(PlanStep(worker=worker, instruction=instruction.strip(), access=access))
    return Plan(thought=thought, steps=parsed)
