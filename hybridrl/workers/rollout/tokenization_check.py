"""Does a multi-turn trajectory's token sequence equal its conversation tokenised at once?

The agent loop builds a response turn by turn: the model's tokens as sampled, and between them the ids
of the text the chat template adds (hybridrl/workers/rollout/chat_delta.py). Training then reads that
sequence. If the template, applied to the finished conversation, would tokenise it differently (a
tokenizer that merges across a turn boundary, a template that rewrites earlier turns, a model that
ends a turn with a token the template does not use), the model is trained on a context it will never
see when served. This module compares the two, per `multi_turn.tokenization_sanity_check_mode`:

    strict              any difference in the ids counts
    ignore_strippable   only differences in the text beyond whitespace count
    disable             nothing is compared

The conversation is rendered after a fixed one-message prompt, so the check covers the response, which
is the part the loop assembled; the prompt is the dataset's, tokenised at once already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridrl.workers.rollout.chat_delta import ChatTemplateDelta


def mismatch(delta: ChatTemplateDelta, messages: Sequence[Mapping[str, Any]], response_ids: Sequence[int],
             mode: str) -> str | None:
    """None when the turn-by-turn `response_ids` agree with `messages` tokenised at once under `mode`
    (strict or ignore_strippable; the caller skips the check under disable); otherwise where they first
    differ (for the log)."""
    expected = delta.ids_of_turns(messages)
    actual = list(response_ids)
    if expected == actual:
        return None
    decode = delta.tokenizer.decode
    if mode == "ignore_strippable" and "".join(decode(expected).split()) == "".join(decode(actual).split()):
        return None
    at = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b), min(len(expected), len(actual)))
    return (f"at response token {at}: turn by turn {decode(actual[at:at + 8])!r}, "
            f"whole conversation {decode(expected[at:at + 8])!r}")
