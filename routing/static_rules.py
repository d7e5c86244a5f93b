"""The static conductor's rules (routing.conductors.static): a workflow per kind of task, written by hand.

Free of Django, so that training.policy (which offers the same workflows to the learned policy) and the
benchmarks read them without the app.
"""

from __future__ import annotations

from typing import Any

# The checking step of a cross-check (training.policy writes the same step).
CROSS_CHECK_INSTRUCTION = (
    "Two solvers answered the problem below. Check their work and give the correct final answer.\n\n{task}"
)

DEFAULT_STATIC_RULES: dict[str, Any] = {
    # Rules are tried in order; the first whose workers are all allowed and whose condition holds wins.
    # "{task}" in an instruction is replaced by the task text.
    "rules": [
        {
            "name": "hard-math-cross-check",
            "when": {"domain": ["math-l5"]},
            "steps": [
                {"worker": "gpt-4o-mini-2024-07-18", "instruction": "{task}", "access": []},
                {"worker": "gemini-1.5-flash", "instruction": "{task}", "access": []},
                {
                    "worker": "gpt-4o-2024-08-06",
                    "instruction": CROSS_CHECK_INSTRUCTION,
                    "access": "all",
                },
            ],
        },
        {
            "name": "code-reasoning",
            "when": {"domain": ["cruxeval-o"]},
            "steps": [{"worker": "gpt-4o-2024-08-06", "instruction": "{task}", "access": []}],
        },
        {
            "name": "default-cheap",
            "when": {},
            "steps": [{"worker": "gpt-4o-mini-2024-07-18", "instruction": "{task}", "access": []}],
        },
    ]
}
