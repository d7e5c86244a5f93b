"""The learned conductor's actions: workflows in the paper's format, the plans they write, and what
each would have scored and cost on a recorded item (simulate).

- single: one worker answers;
- cascade: two cheap workers answer; the conductor, called as the third step, passes the answer through
  when they agree and asks a judge when they do not;
- cross-check: two workers answer and a third always checks their work and gives the answer (the static
  conductor's rule for hard math, offered so that choosing the rules is always open to the policy);
- vote: like a cascade, but on disagreement the conductor first asks a tie-breaker (a third worker):
  if its answer agrees with one of the two earlier answers it is the majority answer and passes through
  (the inner plan's own conductor step does that check), else a judge is asked.

Answers "agree" when their domain's scorer says each matches the other (numbers compare as numbers,
Python literals as values), so "18" and "$18.00" agree. simulate() and the live conductor step
(training.conductor.LearnedConductor) use the same test.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from typing import Any

from routing.scoring.scorers import SCORERS, scorer_name
from routing.static_rules import CROSS_CHECK_INSTRUCTION, DEFAULT_STATIC_RULES

from .kinds import agreement_scorer


@dataclass(frozen=True)
class Workflow:
    """Single: workers = (w,). Cascade and cross-check: (a, b, judge). Vote: (a, b, tie_breaker, judge)."""

    kind: str  # "single" | "cascade" | "check" | "vote"
    workers: tuple[str, ...]

    @property
    def name(self) -> str:
        if self.kind == "single":
            return self.workers[0]
        if self.kind == "vote":
            a, b, tie, judge = self.workers
            return f"vote({a}+{b}->{tie}->{judge})"
        a, b, judge = self.workers
        if self.kind == "check":
            return f"cross-check({a}+{b}=>{judge})"
        return f"cascade({a}+{b}->{judge})"

    @property
    def needs_recursion(self) -> bool:
        return self.kind not in ("single", "check")

    def plan(self, task_text: str) -> dict[str, Any]:
        """The workflow as the conductor writes it (DESIGN.md's format)."""
        if self.kind == "single":
            return {
                "thought": f"one worker: {self.name}",
                "steps": [{"worker": self.workers[0], "instruction": task_text, "access": []}],
            }
        a, b = self.workers[:2]
        if self.kind == "check":
            return {
                "thought": f"two answers; {self.workers[2]} checks them and answers",
                "steps": [
                    {"worker": a, "instruction": task_text, "access": []},
                    {"worker": b, "instruction": task_text, "access": []},
                    {"worker": self.workers[2], "instruction": check_instruction(task_text), "access": "all"},
                ],
            }
        if self.kind == "vote":
            thought = f"two cheap answers; on disagreement {self.workers[2]} breaks the tie, {self.workers[3]} judges"
            instruction = vote_instruction(self.workers[2], self.workers[3])
        else:
            thought = f"two cheap answers; escalate to {self.workers[2]} only if they disagree"
            instruction = cascade_instruction(self.workers[2])
        return {
            "thought": thought,
            "steps": [
                {"worker": a, "instruction": task_text, "access": []},
                {"worker": b, "instruction": task_text, "access": []},
                {"worker": "conductor", "instruction": instruction, "access": "all"},
            ],
        }


# --- the conductor step's instructions: written by the plan, read back by the inner (recursive) call ---


def check_instruction(task_text: str) -> str:
    """The checking step of a cross-check: the static conductor's words (its hard-math rule)."""
    return CROSS_CHECK_INSTRUCTION.replace("{task}", task_text)


def cascade_instruction(judge: str) -> str:
    return f"If the two answers agree, pass them through; otherwise ask {judge}."


def vote_instruction(tie_breaker: str, judge: str) -> str:
    return (
        f"If the two answers agree, pass them through; otherwise ask {tie_breaker} to break the tie, "
        f"then {judge} if it agrees with neither."
    )


def tie_instruction(judge: str, earlier: list[str]) -> str:
    """The inner plan's conductor step: pass the tie-breaker's answer through if it matches an earlier one."""
    return (
        f"If this answer agrees with one of the earlier answers, pass it through; otherwise ask {judge}. "
        f"Earlier answers: {json.dumps(earlier)}"
    )


_VOTE = re.compile(r"otherwise ask ([\w.\-]+) to break the tie, then ([\w.\-]+) if it agrees with neither")
_JUDGE = re.compile(r"otherwise ask ([\w.\-]+)\.")
_EARLIER = re.compile(r"Earlier answers: (\[.*\])\s*$", re.DOTALL)


def parse_instruction(instruction: str) -> dict[str, Any]:
    """What a conductor step written by Workflow.plan (or by the inner call) asks for.

    {"kind": "vote", "tie_breaker", "judge"} | {"kind": "tie", "judge", "earlier"} |
    {"kind": "cascade", "judge"} | {"kind": "unknown"}.
    """
    found = _VOTE.search(instruction)
    if found:
        return {"kind": "vote", "tie_breaker": found.group(1), "judge": found.group(2)}
    judge = _JUDGE.search(instruction)
    earlier = _EARLIER.search(instruction)
    if judge and earlier:
        try:
            answers = [str(a) for a in json.loads(earlier.group(1))]
        except (json.JSONDecodeError, TypeError):
            answers = []
        return {"kind": "tie", "judge": judge.group(1), "earlier": answers}
    if judge:
        return {"kind": "cascade", "judge": judge.group(1)}
    return {"kind": "unknown"}


# --- outcomes ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    correct: float
    cost_usd: float


def answer_key(answer: str) -> str:
    return re.sub(r"\s+", "", str(answer)).strip().lower().rstrip(".")


def agree(a: str, b: str, domain: str = "", scorer: str | None = None) -> bool:
    """Do two extracted answers say the same thing? Keys match, or the kind's scorer (`scorer`, else
    the default for the label `domain`) accepts each as the other's reference (non-empty answers only)."""

    key = answer_key(a)
    if not key:
        return False
    if key == answer_key(b):
        return True
    if not answer_key(b) or len(a) > 2000 or len(b) > 2000:
        return False
    compare = SCORERS[agreement_scorer(scorer or scorer_name("auto", domain))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return compare(str(a), str(b)) == 1.0 and compare(str(b), str(a)) == 1.0
        except Exception:  # noqa: BLE001 - a scorer choking on odd text means "no agreement"
            return False


def simulate(
    workflow: Workflow, outcomes: dict[str, dict[str, Any]], domain: str = "", scorer: str | None = None
) -> Outcome:
    """What a workflow would have scored and cost on one recorded item (as the engine runs it);
    answers agree by `scorer` (else the default for `domain`)."""
    if workflow.kind == "single":
        o = outcomes[workflow.workers[0]]
        return Outcome(float(o["score"]), float(o["cost_usd"]))
    a, b = outcomes[workflow.workers[0]], outcomes[workflow.workers[1]]
    cost = float(a["cost_usd"]) + float(b["cost_usd"])
    if workflow.kind == "check":  # the checker always answers
        judge = outcomes[workflow.workers[-1]]
        return Outcome(float(judge["score"]), cost + float(judge["cost_usd"]))
    if agree(a["answer"], b["answer"], domain, scorer):
        return Outcome(float(b["score"]), cost)  # the last response passes through
    if workflow.kind == "vote":
        tie = outcomes[workflow.workers[2]]
        cost += float(tie["cost_usd"])
        if agree(tie["answer"], a["answer"], domain, scorer) or agree(
            tie["answer"], b["answer"], domain, scorer
        ):
            return Outcome(float(tie["score"]), cost)
    judge = outcomes[workflow.workers[-1]]
    return Outcome(float(judge["score"]), cost + float(judge["cost_usd"]))


MINI, FLASH, QWEN, LLAMA70, HAIKU = (
    "gpt-4o-mini-2024-07-18",
    "gemini-1.5-flash",
    "Qwen2-72B-Instruct",
    "Meta-Llama-3.1-70B-Instruct",
    "claude-3-haiku-20240307",
)
GPT4O, SONNET, PRO = "gpt-4o-2024-08-06", "claude-3-5-sonnet-20240620", "gemini-1.5-pro"


def rule_workflow(steps: list[dict[str, Any]]) -> Workflow | None:
    """The workflow a static rule's steps are, where they are one: one step (single), or two answers
    and a third step that sees them and answers (cross-check)."""
    workers = tuple(step["worker"] for step in steps)
    if len(steps) == 1:
        return Workflow("single", workers)
    if len(steps) == 3 and [s["access"] for s in steps] == [[], [], "all"]:
        return Workflow("check", workers)
    return None


def static_rule_workflows(rules: dict[str, Any] = DEFAULT_STATIC_RULES) -> dict[str, Workflow]:
    """The static conductor's rules as workflows: each rule's domains (and "" for a rule with no
    condition, the default) to its workflow; the first rule for a domain wins, as the conductor tries them."""
    chosen: dict[str, Workflow] = {}
    for rule in rules["rules"]:
        workflow = rule_workflow(rule["steps"])
        if workflow is not None:
            for domain in (rule.get("when") or {}).get("domain") or [""]:
                chosen.setdefault(domain, workflow)
    return chosen


def default_actions(models: list[str]) -> list[Workflow]:
    """Every single model, cascades of two cheap workers with a strong judge, votes whose tie-breaker
    and judge come from the pool's strongest (chosen offline on the train split: the workflows on each
    domain's accuracy/cost frontier), and the static conductor's rules, so that the policy may always
    choose what the rules would."""
    actions = [Workflow("single", (m,)) for m in models]
    cheap = [m for m in (MINI, FLASH, QWEN, LLAMA70) if m in models]
    judges = [m for m in (GPT4O, SONNET) if m in models]
    for i, a in enumerate(cheap):
        for b in cheap[i + 1 :]:
            for judge in judges:
                actions.append(Workflow("cascade", (a, b, judge)))
    votes = [
        (MINI, QWEN, GPT4O, SONNET),
        (MINI, QWEN, SONNET, GPT4O),
        (MINI, LLAMA70, SONNET, GPT4O),
        (MINI, HAIKU, GPT4O, SONNET),
        (MINI, QWEN, HAIKU, SONNET),
        (MINI, QWEN, HAIKU, GPT4O),
        (MINI, FLASH, QWEN, GPT4O),
        (MINI, FLASH, QWEN, PRO),
        (FLASH, QWEN, MINI, GPT4O),
        (FLASH, LLAMA70, PRO, MINI),
    ]
    for workers in votes:
        if all(w in models for w in workers):
            actions.append(Workflow("vote", workers))
    for workflow in static_rule_workflows().values():
        if workflow not in actions and all(w in models for w in workflow.workers):
            actions.append(workflow)
    return actions
