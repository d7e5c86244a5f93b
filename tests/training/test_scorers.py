"""Scorers: answer extraction from worker responses and the comparisons with a reference."""

from __future__ import annotations

import pytest

from routing.scoring.scorers import (
    SCORER_CHOICES,
    exact,
    extract_answer,
    literal,
    math,
    numeric,
    score,
    scorer_name,
)

# --- extract_answer ---------------------------------------------------------------------------


def test_answer_from_fenced_json_with_an_invalid_single_quote_escape():
    # Models write \' inside JSON strings; strict JSON rejects it, the scorer must not.
    response = 'Reasoning done.\n```json\n{"reasoning": "it\\\'s 6 * 7", "answer": "42"}\n```'
    assert "\\'" in response

    assert extract_answer(response) == "42"


def test_a_structured_answer_in_json_with_an_invalid_escape_is_parsed_whole():
    response = '```json\n{"reasoning": "it\\\'s a list", "answer": [1, 2, 3]}\n```'

    assert extract_answer(response) == "[1, 2, 3]"


def test_answer_from_fenced_json_keeps_an_escaped_quote_in_the_answer():
    response = '```json\n{"answer": "Rock \\\'n\\\' roll"}\n```'

    assert extract_answer(response) == "Rock 'n' roll"


def test_answer_from_json_is_converted_to_text():
    assert extract_answer('{"reasoning": "r", "answer": 12}') == "12"
    assert extract_answer('{"answer": [1, 2]}') == "[1, 2]"


def test_answer_field_in_broken_json_is_still_found():
    assert extract_answer('{"reasoning": "unterminated, "answer": "7"') == "7"


def test_answer_from_boxed_with_nested_braces():
    response = "We simplify and get $\\boxed{\\frac{1}{2}}$ as required."

    assert extract_answer(response) == "\\frac{1}{2}"


def test_the_last_boxed_wins():
    assert extract_answer("First \\boxed{3}, corrected: \\boxed{4}") == "4"


def test_answer_from_an_answer_is_phrase():
    assert extract_answer("Adding them up, the answer is 12.") == "12"
    assert extract_answer("The Answer: 7") == "7"


def test_fallback_is_the_last_non_empty_line():
    assert extract_answer("thinking...\n\n  99  \n\n") == "99"
    assert extract_answer("   ") == ""


# --- numeric ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("1,234", "1234"),
        ("$1,234.00", "1234"),
        ("3/4", "0.75"),
        ("0.75", "3/4"),
        ("50%", "50"),
        ("-12", "-12.0"),
        ("0.3333333", "1/3"),  # within the absolute tolerance of 1e-6
        ("1000000.5", "1000000"),  # the tolerance is relative for large references
        ("The total is 18 eggs", "18"),
    ],
)
def test_numeric_equal(answer, reference):
    assert numeric(answer, reference) == 1.0


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("0.33", "1/3"),
        ("1000002", "1000000"),
        ("12", "-12"),
        ("1,235", "1234"),
        ("no number", "5"),
        ("5", "n/a"),
        ("1/0", "1"),
    ],
)
def test_numeric_different(answer, reference):
    assert numeric(answer, reference) == 0.0


# --- exact ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("$\\dfrac{1}{2}$", "\\frac{1}{2}"),
        ("\\tfrac{3}{4}", "\\frac{3}{4}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\text{Paris}", "paris"),
        ("3\\,000", "3000"),
        ("Paris.", "Paris"),
    ],
)
def test_exact_normalises_latex(answer, reference):
    assert exact(answer, reference) == 1.0


@pytest.mark.parametrize(
    ("answer", "reference"), [("\\frac{1}{3}", "\\frac{1}{2}"), ("London", "Paris"), ("0.5", "\\frac{1}{2}")]
)
def test_exact_different(answer, reference):
    assert exact(answer, reference) == 0.0


# --- literal ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("{'a': 1, 'b': [2, 3]}", "{'b': [2, 3], 'a': 1}"),
        ("[1, 2, 3]", "[1,2,3]"),
        ('"abc"', "'abc'"),
        ("(1, 'x')", "(1,'x')"),
        ("3.0", "3"),
    ],
)
def test_literal_compares_python_values(answer, reference):
    assert literal(answer, reference) == 1.0


@pytest.mark.parametrize(
    ("answer", "reference"),
    [("[1, 2]", "[2, 1]"), ("(1, 2)", "[1, 2]"), ("'1'", "1"), ("{'a': 1}", "{'a': 2}")],
)
def test_literal_different_values(answer, reference):
    assert literal(answer, reference) == 0.0


def test_literal_falls_back_to_exact_when_not_a_literal():
    assert literal("Hello World", "hello world") == 1.0
    assert literal("foo(1)", "foo( 1 )") == 1.0
    assert literal("foo(1)", "foo(2)") == 0.0


# --- math -------------------------------------------------------------------------------------


def test_math_accepts_equivalent_latex_and_numbers():
    assert math("\\dfrac{1}{2}", "\\frac{1}{2}") == 1.0
    assert math("0.5", "1/2") == 1.0  # a plain-number reference is compared numerically
    assert math("1,000", "1000") == 1.0


def test_math_does_not_compare_expressions_numerically():
    assert math("1.414", "\\sqrt{2}") == 0.0
    assert math("\\frac{1}{3}", "\\frac{1}{2}") == 0.0
    assert math("3", "4") == 0.0


# --- score ------------------------------------------------------------------------------------


def test_score_picks_numeric_for_gsm8k():
    response = "She has 1,234 apples. The answer is 1,234."

    assert score(response=response, reference="1234", domain="gsm8k") == (1.0, "1,234")
    # Without the domain the default is exact comparison, which the comma defeats.
    assert score(response=response, reference="1234")[0] == 0.0


def test_score_picks_literal_for_cruxeval_output():
    response = '```json\n{"reasoning": "the dict is rebuilt", "answer": "{\'b\': 2, \'a\': 1}"}\n```'

    assert score(response=response, reference="{'a': 1, 'b': 2}", domain="cruxeval-o") == (
        1.0,
        "{'b': 2, 'a': 1}",
    )
    assert score(response=response, reference="{'a': 1, 'b': 2}", domain="other")[0] == 0.0


def test_score_picks_math_for_math_l5():
    response = "Therefore the probability is $\\boxed{\\dfrac{1}{2}}$."

    assert score(response=response, reference="\\frac{1}{2}", domain="math-l5") == (1.0, "\\dfrac{1}{2}")
    assert score(response="\\boxed{0.5}", reference="1/2", domain="math-l5")[0] == 1.0


def test_an_explicit_scorer_overrides_the_domain():
    assert score(response="The answer is 1,234.", reference="1234", scorer="exact", domain="gsm8k")[0] == 0.0
    assert score(response="x = 1,234", reference="1234", scorer="numeric")[0] == 1.0


def test_scorer_names():
    assert scorer_name("auto", "gsm8k") == "numeric"
    assert scorer_name("auto", "cruxeval-o") == "literal"
    assert scorer_name("auto", "math-l5") == "math"
    assert scorer_name("auto", "unknown") == "exact"
    assert scorer_name("literal", "gsm8k") == "literal"
    assert SCORER_CHOICES == ["auto", "numeric", "exact", "literal", "math", "regex", "judge"]


def test_an_unknown_scorer_is_an_error():
    with pytest.raises(KeyError):
        score(response="1", reference="1", scorer="fuzzy")
