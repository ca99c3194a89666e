"""Checks of every row of a prompt dataset, run when the dataset is built, before any worker starts.

A bad row found when the dataloader reaches it costs every step before it (an overlong prompt at row
180 ended a run at step 23). These checks are cheap per row, so `RLHFDataset` runs them over the whole
file at load time and raises one `DataError` that lists the bad rows by file, row and column, with the
fix. Each check returns a short description of what is wrong, or None for a usable value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_LISTED = 5  # rows listed in one error; the rest are counted

PROMPT_FIX = ("store each prompt as a non-empty list of {\"role\": ..., \"content\": ...} messages (or a "
              "non-empty string), or remove the row")
GROUND_TRUTH_FIX = ("store the reference answer in the row's reward_model.ground_truth (an empty string if "
                    "your reward function does not read it), or score with a reward model "
                    "(reward_model.enable=true)")


class DataError(ValueError):
    """Rows of a data file that training cannot use; the message names file, row, column and fix."""


@dataclass(frozen=True)
class RowProblem:
    origin: str  # "<file> row <n>", the row's position in its parquet file
    column: str  # as the message shows it: "'prompt'", or "'prompt' + 'response'" for a whole chat
    problem: str
    fix: str


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def prompt_problem(prompt: Any) -> str | None:
    """What makes `prompt` unusable: it must be a non-empty string or a list of chat messages with a
    string role and string content, not all of it blank."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "the prompt is an empty string"
    if not isinstance(prompt, list | tuple):
        return (f"must hold a list of chat messages or a string, got {type(prompt).__name__} "
                f"{_short(prompt)}")
    if not prompt:
        return "the prompt is an empty list of chat messages"
    for turn, message in enumerate(prompt):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            return f"message {turn} must be a dict with a string 'role', got {_short(message)}"
        if not isinstance(message.get("content"), str):
            return f"message {turn}'s 'content' must be a string, got {_short(message.get('content'))}"
    if not any(message["content"].strip() for message in prompt):
        return "every message of the prompt has empty content"
    return None


def ground_truth_problem(reward_model: Any) -> str | None:
    """What keeps a rule-based reward from scoring the row: `reward_model` must be a dict whose
    `ground_truth` is present and not null."""
    if not isinstance(reward_model, Mapping):
        return (f"must be a dict with a 'ground_truth' entry, got {type(reward_model).__name__} "
                f"{_short(reward_model)}")
    if reward_model.get("ground_truth") is None:
        return "reward_model.ground_truth is missing or null"
    return None


def raise_if_any(problems: list[RowProblem], total_rows: int) -> None:
    """Raise one DataError listing the first MAX_LISTED problems, the count of the rest, and each fix."""
    if not problems:
        return
    lines = [f"  {p.origin}, column {p.column}: {p.problem}" for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        lines.append(f"  ... and {len(problems) - MAX_LISTED} more")
    fixes = list(dict.fromkeys(p.fix for p in problems))  # distinct, in order of first appearance
    raise DataError(
        f"{len(problems)} of {total_rows} data rows cannot be used (checked before training starts):\n"
        + "\n".join(lines) + "\nFix: " + "\nFix: ".join(fixes)
    )
