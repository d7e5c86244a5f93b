"""parse_plan and workflow_schema: a conductor's output is untrusted data; every rule holds whatever it wrote."""

from __future__ import annotations

import json

import pytest

from routing import limits
from routing.plans import MAX_STEPS, Plan, PlanError, PlanStep, parse_plan, workflow_schema

WORKERS = {"alpha", "beta", "gamma"}


def plan_text(*steps: dict, thought: str = "because") -> str:
    return json.dumps({"thought": thought, "steps": list(steps)})


def step(worker: str = "alpha", instruction: str = "Do it", access=()) -> dict:
    return {
        "worker": worker,
        "instruction": instruction,
        "access": list(access) if isinstance(access, tuple) else access,
    }


def parse(raw: str, **kwargs) -> Plan:
    return parse_plan(raw, allowed_workers=WORKERS, **kwargs)


def rejects(raw: str, match: str, **kwargs) -> str:
    with pytest.raises(PlanError, match=match) as info:
        parse(raw, **kwargs)
    return str(info.value)


# --- accepted plans ---------------------------------------------------------------------------


def test_a_valid_plan_is_parsed_into_steps():
    raw = plan_text(
        step("alpha", "  Solve part A  ", []),
        step("beta", "Solve part B", [0]),
        step("gamma", "Combine", "all"),
        thought="split then combine",
    )

    plan = parse(raw)

    assert plan.thought == "split then combine"
    assert plan.steps == [
        PlanStep("alpha", "Solve part A", []),  # the instruction is stripped
        PlanStep("beta", "Solve part B", [0]),
        PlanStep("gamma", "Combine", "all"),
    ]
    assert plan.as_dict()["steps"][2] == {"worker": "gamma", "instruction": "Combine", "access": "all"}
    assert Plan.from_dict(plan.as_dict()) == plan


def test_thought_is_optional():
    assert parse(json.dumps({"steps": [step()]})).thought == ""


@pytest.mark.parametrize(
    "wrap",
    [
        lambda p: f"```json\n{p}\n```",
        lambda p: f"```\n{p}\n```",
        lambda p: f"Here is the workflow:\n```json\n{p}\n```\nLet me know if it should change.",
        lambda p: f"Sure! {p} That is my plan.",
    ],
    ids=["json-fence", "bare-fence", "fence-with-prose", "prose-around"],
)
def test_json_in_fences_or_with_prose_around_it_is_accepted(wrap):
    raw = wrap(plan_text(step("beta", "Answer", [])))

    plan = parse(raw)

    assert plan.steps == [PlanStep("beta", "Answer", [])]


def test_access_all_lets_a_step_see_every_earlier_step():
    plan = parse(plan_text(step("alpha"), step("beta"), step("gamma", access="all")))

    assert plan.steps[2].visible_indices(2) == [0, 1]
    assert plan.steps[0].visible_indices(0) == []


def test_access_list_may_repeat_and_be_unordered_but_visible_indices_are_sorted_unique():
    plan = parse(plan_text(step(), step(), step("gamma", access=[1, 0, 1])))

    assert plan.steps[2].access == [1, 0, 1]
    assert plan.steps[2].visible_indices(2) == [0, 1]


def test_empty_steps_are_accepted_only_when_allowed():
    rejects(plan_text(), "no steps")

    plan = parse(plan_text(thought="already answered"), allow_empty=True)

    assert plan.steps == [] and plan.thought == "already answered"


# --- malformed output -------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["{not json", '{"thought": "x", "steps": [', "no json here at all"])
def test_malformed_json_is_rejected_with_its_position(raw):
    message = rejects(raw, "not valid JSON")

    assert "line" in message and "column" in message


@pytest.mark.parametrize("raw", ["", "   \n  "])
def test_empty_output_is_rejected(raw):
    rejects(raw, "empty")


@pytest.mark.parametrize("raw", ["[1, 2, 3]", "42", '"a plan"', "null"])
def test_output_that_is_not_an_object_is_rejected(raw):
    rejects(raw, "must be a JSON object")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"thought": "x"}, "'steps' must be a list"),
        ({"thought": "x", "steps": {"worker": "alpha"}}, "'steps' must be a list"),
        ({"thought": 3, "steps": [step()]}, "'thought' must be a string"),
        ({"steps": ["alpha"]}, "step 0 must be an object"),
        ({"steps": [{"worker": "alpha", "access": []}]}, "step 0 lacks 'instruction'"),
        ({"steps": [step(), {"instruction": "x"}]}, "step 1 lacks 'worker', 'access'"),
    ],
    ids=[
        "no-steps-key",
        "steps-not-list",
        "thought-not-string",
        "step-not-object",
        "no-instruction",
        "two-missing",
    ],
)
def test_missing_or_mistyped_keys_are_rejected(data, match):
    rejects(json.dumps(data), match)


# --- workers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("worker", ["mallory", "ALPHA", "", 7, None])
def test_an_unknown_worker_is_rejected_and_the_message_lists_the_allowed_ones(worker):
    message = rejects(plan_text(step("alpha"), step(worker)), "step 1 names worker")

    assert message.endswith("allowed workers: alpha, beta, gamma")
    assert repr(worker) in message


def test_allowed_workers_is_the_only_source_of_truth():
    with pytest.raises(PlanError, match="allowed workers: beta"):
        parse_plan(plan_text(step("alpha")), allowed_workers={"beta"})


# --- access -----------------------------------------------------------------------------------


def test_the_first_step_may_not_see_anything():
    rejects(plan_text(step(access=[0])), r"step 0's access list \[0\] must be empty")


@pytest.mark.parametrize(
    ("access", "forward"),
    [([1], "[1]"), ([2], "[2]"), ([0, 3], "[3]"), ([-1], "[-1]")],
    ids=["itself", "forward", "one-of-two-forward", "negative"],
)
def test_access_pointing_at_itself_forward_or_negative_is_rejected(access, forward):
    raw = plan_text(step(), step("beta", access=access), step("gamma"), step("gamma"))

    message = rejects(raw, "step 1's access list")

    assert f"points at steps {forward}" in message
    assert "may only see earlier steps (0..0)" in message


@pytest.mark.parametrize(
    "access",
    [["0"], [True], [False], [0.0], [None], "none", "ALL", 0, {"0": True}, None],
    ids=[
        "string-index",
        "true",
        "false",
        "float",
        "null-index",
        "other-string",
        "upper-all",
        "int",
        "object",
        "null",
    ],
)
def test_access_must_be_all_or_a_list_of_integers(access):
    raw = plan_text(step(), step("beta", access=access))

    rejects(raw, 'step 1\'s access must be "all" or a list of earlier step indices')


# --- sizes and instructions -------------------------------------------------------------------


def test_more_than_five_steps_are_rejected():
    assert MAX_STEPS == 5
    parse(plan_text(*[step() for _ in range(5)]))

    rejects(plan_text(*[step() for _ in range(6)]), "the plan has 6 steps; at most 5 are allowed")


def test_a_lower_max_steps_is_enforced():
    parse(plan_text(step(), step()), max_steps=2)

    rejects(plan_text(step(), step(), step()), "the plan has 3 steps; at most 2 are allowed", max_steps=2)


@pytest.mark.parametrize("instruction", ["", "   ", "\n\t", None, 5, ["do", "it"]])
def test_an_empty_or_non_string_instruction_is_rejected(instruction):
    rejects(plan_text(step(), step("beta", instruction)), "step 1 has an empty instruction")


def test_an_instruction_may_quote_the_longest_task_whole_with_its_framing_and_no_more(settings):
    settings.CONDUCTOR_MAX_TASK_CHARS = 1_000
    longest = 1_000 + limits.INSTRUCTION_FRAMING_CHARS

    assert parse(plan_text(step(instruction="x" * longest))).steps[0].instruction == "x" * longest
    message = rejects(plan_text(step(instruction="x" * (longest + 1))), "step 0's instruction")
    assert message == (
        f"step 0's instruction has {longest + 1} characters; at most {longest} are allowed "
        "(the longest task, CONDUCTOR_MAX_TASK_CHARS, quoted whole, and its framing)"
    )


# --- schema -----------------------------------------------------------------------------------


def test_workflow_schema_lists_the_allowed_workers_sorted_and_caps_the_steps():
    schema = workflow_schema(["gamma", "alpha", "beta"], max_steps=3)

    steps = schema["properties"]["steps"]
    item = steps["items"]
    assert schema["required"] == ["thought", "steps"]
    assert schema["additionalProperties"] is False
    assert steps["type"] == "array" and steps["maxItems"] == 3
    assert item["properties"]["worker"]["enum"] == ["alpha", "beta", "gamma"]
    assert item["required"] == ["worker", "instruction", "access"]
    assert item["additionalProperties"] is False
    access = item["properties"]["access"]["anyOf"]
    assert {"type": "string", "enum": ["all"]} in access
    assert {"type": "array", "items": {"type": "integer", "minimum": 0}} in access


def test_workflow_schema_defaults_to_five_steps():
    assert workflow_schema(["alpha"])["properties"]["steps"]["maxItems"] == MAX_STEPS


def test_a_plan_that_the_schema_describes_parses():
    schema = workflow_schema(sorted(WORKERS))
    workers = schema["properties"]["steps"]["items"]["properties"]["worker"]["enum"]
    raw = plan_text(*[step(w, f"task for {w}", "all" if i else []) for i, w in enumerate(workers)])

    assert [s.worker for s in parse(raw).steps] == workers
