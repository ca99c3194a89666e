"""Hand-written cases for the rule-based scorers and the data_source dispatch."""

import time

import numpy as np
import pytest

from hybridrl.rewards import default_compute_score, scorers

# ---------------------------------------------------------------- gsm8k


def test_gsm8k_strict_takes_last_marker_and_drops_commas():
    # Two markers: the last one counts; "1,000" loses its comma before comparison.
    text = "First guess #### 12\nOn reflection 1000 apples.\n#### 1,000"
    assert scorers.gsm8k_score(text, "1000") == 1.0
    assert scorers.gsm8k_score("#### 12", "1000") == 0.0


def test_gsm8k_strict_ignores_bare_numbers_but_flexible_uses_the_last():
    text = "So the total is 72 dollars."
    assert scorers.gsm8k_score(text, "72", method="strict") == 0.0  # no "####": no answer
    assert scorers.gsm8k_score(text, "72", method="flexible") == 1.0
    # Flexible skips a trailing lone "." and takes the last real number.
    assert scorers.extract_solution("It is 3, then 72.", method="flexible") == "72."


def test_gsm8k_format_score_for_wrong_answer_only():
    assert scorers.gsm8k_score("#### 5", "6", format_score=0.1) == 0.1
    assert scorers.gsm8k_score("no answer", "6", format_score=0.1) == 0.0


def test_gsm8k_only_reads_last_300_characters():
    # The marker is 301+ characters before the end: verl ignores it.
    text = "#### 7" + " filler" * 60
    assert scorers.gsm8k_score(text, "7") == 0.0


# ---------------------------------------------------------------- math


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # MATH normalisation maps 0.5 to \frac{1}{2}
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),  # dfrac -> frac, then \frac12 -> \frac{1}{2}
        ("\\boxed{1,000}", "1000", 1.0),  # only math_verify knows the thousands separator
        ("\\boxed{\\frac{2}{4}}", "0.5", 1.0),  # symbolic: 2/4 == 1/2
        ("\\boxed{5}. That is the final answer, five.", "5", 1.0),  # trailing text after the box
        ("\\boxed{3} wait, no: \\boxed{4}", "4", 1.0),  # last box wins
        ("\\boxed{3} wait, no: \\boxed{4}", "3", 0.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{x = 7}", "7", 1.0),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
        ("The answer is 5", "5", 0.0),  # no box: no answer
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("\\boxed{\\frac{1}{2}", "0.5", 0.0),  # unbalanced braces
    ],
)
def test_math_cases(response, truth, expected):
    assert scorers.math_score(response, truth) == expected


def test_math_last_boxed_handles_nesting_and_fbox():
    assert scorers.last_boxed_only_string("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\boxed{\\frac{1}{\\sqrt{2}}}"
    assert scorers.remove_boxed(scorers.last_boxed_only_string("\\fbox{9}")) == "9"
    assert scorers.remove_boxed(scorers.last_boxed_only_string("$\\boxed 9$")) == "9"


def test_math_is_equiv_is_string_level_only():
    assert scorers.is_equiv("\\frac{1}{2}", "0.5")
    assert scorers.is_equiv("3/4", "\\frac34")
    assert not scorers.is_equiv("1,000", "1000")  # string rules alone miss this; math_verify catches it
    assert scorers.is_equiv(None, None) and not scorers.is_equiv("1", None)


# ---------------------------------------------------------------- countdown

GT = {"target": 24, "numbers": [3, 4, 6, 2]}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("<answer>(6 - 2) * (3 + 4) - 4</answer>", 0.1),  # 4 used twice -> well-formed but invalid
        ("<answer>3 * 4 + 6 * 2</answer>", 1.0),  # 12 + 12 = 24, each number once
        ("<answer>6 / (3 - 2) * 4</answer>", 1.0),  # 6 / 1 * 4 = 24, all four numbers once
        ("<answer>6 * 4</answer>", 0.1),  # 24 but 3 and 2 unused: exactly_once fails
        ("<answer>(3 + 4 + 6) * 2</answer>", 0.1),  # 13 * 2 = 26: wrong value
        ("<answer>3 * 8 + 6 - 2 - 4</answer>", 0.1),  # 8 is not a given number
        ("<answer>6 / (4 - 2 - 2) + 3</answer>", 0.1),  # division by zero (and 2 reused)
        ("<answer>9**9**9</answer>", 0.1),  # power is rejected before any evaluation
        ("<answer>__import__('os')</answer>", 0.1),
        ("<answer>6 * 4 * (3 - 2)</answer> trailing words", 1.0),  # 24 * 1, trailing text ignored
        ("The answer is 3*4+6*2", 0.0),  # no answer tag at all
        ("<answer>1+1</answer> then <answer>(6 - 2) * 3 * 2</answer>", 0.1),  # last tag counts; 2 reused
    ],
)
def test_countdown_cases(answer, expected):
    assert scorers.countdown_score(answer, GT) == expected


def test_countdown_power_does_not_hang():
    start = time.monotonic()
    scorers.countdown_score("<answer>9**9**9**9</answer>", GT)
    # Not a timing assertion on speed: just proof the call returned (evaluation would never end).
    assert time.monotonic() - start < 60


def test_countdown_division_is_exact_and_at_most_once_mode():
    gt = {"target": 2, "numbers": np.array([4, 6, 3])}  # numpy, as read from parquet
    # 6 / 3 = 2 exactly, 4 unused: allowed only with at_most_once.
    assert scorers.countdown_score("<answer>6 / 3</answer>", gt, number_use="at_most_once") == 1.0
    assert scorers.countdown_score("<answer>6 / 3</answer>", gt) == 0.1
    # 4 / 6 * 3 = 2 exactly in rationals (floats would give 1.9999999999999998).
    assert scorers.countdown_score("<answer>4 / 6 * 3</answer>", {"target": 2, "numbers": [4, 6, 3]}) == 1.0


def test_countdown_bad_ground_truth_names_the_fields():
    with pytest.raises(ValueError, match="'target' and 'numbers'"):
        scorers.countdown_score("<answer>1</answer>", 24)


# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("5 + 8 = 13, carry 1 ... <answer>85</answer>", "85", 1.0),
        ("<answer> -12 </answer>", "-12", 1.0),
        ("<answer>84</answer>", "85", 0.0),
        ("<answer>85</answer> no wait <answer>86</answer>", "85", 0.0),  # only the last tag counts
        ("<answer>eighty-five</answer>", "85", 0.0),
        ("the answer is 85", "85", 0.0),
    ],
)
def test_arithmetic_cases(response, truth, expected):
    assert scorers.arithmetic_score(response, truth) == expected


def test_arithmetic_format_score_needs_a_tag():
    assert scorers.arithmetic_score("<answer>84</answer>", "85", format_score=0.1) == 0.1
    assert scorers.arithmetic_score("84", "85", format_score=0.1) == 0.0
    with pytest.raises(ValueError, match="integer string"):
        scorers.arithmetic_score("<answer>1</answer>", "one")


# ---------------------------------------------------------------- dispatch


@pytest.mark.parametrize(
    ("source", "response", "truth"),
    [
        ("openai/gsm8k", "#### 42", "42"),
        ("lighteval/MATH", "\\boxed{42}", "42"),
        ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{42}", "42"),
        ("HuggingFaceH4/MATH-500", "\\boxed{42}", "42"),
        ("aime2024", "\\boxed{42}", "42"),
        ("countdown", "<answer>40 + 2</answer>", {"target": 42, "numbers": [40, 2]}),
        ("arithmetic", "<answer>42</answer>", "42"),
    ],
)
def test_default_compute_score_dispatch(source, response, truth):
    assert default_compute_score(source, response, truth) == 1.0


def test_default_compute_score_passes_kwargs_and_rejects_unknown_sources():
    assert default_compute_score("openai/gsm8k", "is 42", "42", method="flexible") == 1.0
    with pytest.raises(NotImplementedError, match="openai/gsm8k.*custom_reward_function.path"):
        default_compute_score("my/new_dataset", "x", "y")
