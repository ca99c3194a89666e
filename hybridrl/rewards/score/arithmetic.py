"""Scorer for hybridrl's default arithmetic task.

The response ends with `<answer>N</answer>` after free-form worked steps; `ground_truth` is the integer
result as a string ("85", "-12"). Only the LAST answer tag counts, so a model cannot hedge by listing
several answers.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INTEGER = re.compile(r"[+-]?\d+")


def extract_answer(solution_str: str) -> str | None:
    """Content of the last `<answer>...</answer>` pair, stripped; None if there is none."""
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def compute_score(
    solution_str: str, ground_truth: str | int, format_score: float = 0.0, score: float = 1.0
) -> float:
    """`score` if the last answer tag holds the right integer, `format_score` if a tag exists but is
    wrong or not an integer, 0.0 if no answer tag exists."""
    try:
        target = int(str(ground_truth).strip())
    except ValueError:
        raise ValueError(
            f"arithmetic ground_truth must be an integer string such as '85' or '-12', got {ground_truth!r}"
        ) from None
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    if _INTEGER.fullmatch(answer) and int(answer) == target:
        return score
    return format_score
