"""GSM8K scorer with verl's two answer-extraction modes.

`strict` only accepts the dataset's own answer marker (`#### 42`); `flexible` takes the last number in
the response. Both look at the last 300 characters only, as verl does, so a long chain of thought
cannot smuggle in an early lucky number and matching stays cheap on very long responses.
"""

from __future__ import annotations

import re

# Only the tail of the response is searched (verl's choice): the final answer sits at the end.
_TAIL_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the answer string (commas and `$` removed) or None when no answer is found."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")
    # Flexible: the last token that is a number and not a bare punctuation mark.
    candidates = [c for c in _FLEXIBLE.findall(tail) if c not in ("", ".")]
    return candidates[-1].replace(",", "") if candidates else None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` for a correct answer, `format_score` for a found but wrong one, 0.0 for none.

    Comparison is on the exact extracted string against `ground_truth` (GSM8K answers are integers
    written without separators once commas are dropped).
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth).replace(",", "") else format_score
