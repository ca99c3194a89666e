"""The tokens the chat template puts between the end of an assistant turn and the model's next turn: the
difference between a fixed chat rendered alone and followed by the new messages (the model's tokens stay as
sampled). `tokenization_mismatch` checks it against the conversation tokenised at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A fixed chat whose end the deltas are measured from; its words never reach a model.
_ANCHOR = [{"role": "user", "content": "anchor question"}, {"role": "assistant", "content": "anchor reply"}]


class ChatTemplateDelta:
    """`ids_after_turn(messages)`: the ids that follow an assistant turn's EOS when `messages` come next."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn rollouts need a tokenizer with a chat_template to add tool responses")
        if not tokenizer.eos_token:
            raise ValueError("multi-turn rollouts need a tokenizer with an EOS token: it ends each assistant turn")
        self.tokenizer = tokenizer
        self._head = self._render(_ANCHOR, add_generation_prompt=False)
        marker = _ANCHOR[-1]["content"] + tokenizer.eos_token
        at = self._head.rfind(marker)
        if at < 0:
            raise ValueError(
                f"the chat template does not end an assistant turn with the EOS token {tokenizer.eos_token!r} "
                f"(rendered: {self._head!r}); the model's turns could not be continued as the template would "
                f"render them")
        self._after_eos = self._head[at + len(marker):]
        # the fixed prompt a whole conversation is rendered after (ids_of_turns), up to the assistant header
        self._prompt_head = self._render(_ANCHOR[:1], add_generation_prompt=True)

    def _render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                  tokenize=False)

    def ids_after_turn(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The ids between an assistant turn's EOS and the start of the next assistant turn's content."""
        full = self._render([*_ANCHOR, *messages], add_generation_prompt=True)
        if not full.startswith(self._head):
            raise ValueError("the chat template renders earlier messages differently once more follow; the tool "
                             "responses cannot be appended turn by turn")
        text = self._after_eos + full[len(self._head):]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def ids_of_turns(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The ids of `messages` (assistant and tool turns) tokenised at once after a fixed prompt, without the
        text after the last assistant turn's EOS: what the turn-by-turn ids should equal."""
        full = self._render([*_ANCHOR[:1], *messages], add_generation_prompt=False)
        if not full.startswith(self._prompt_head):
            raise ValueError("the chat template renders the prompt differently once a reply follows; the turns "
                             "cannot be compared with the whole conversation")
        text = full[len(self._prompt_head):]
        if messages and messages[-1]["role"] == "assistant" and self._after_eos and text.endswith(self._after_eos):
            text = text[: -len(self._after_eos)]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenization_mismatch(delta: ChatTemplateDelta, messages: Sequence[Mapping[str, Any]],
                          response_ids: Sequence[int], mode: str) -> str | None:
    """None when `response_ids` agree with `messages` tokenised at once under `mode` (strict or
    ignore_strippable: equal beyond whitespace), else where they first differ, for the log."""
    expected = delta.ids_of_turns(messages)
    actual = list(response_ids)
    if expected == actual:
        return None
    decode = delta.tokenizer.decode
    if mode == "ignore_strippable" and "".join(decode(expected).split()) == "".join(decode(actual).split()):
        return None
    at = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
              min(len(expected), len(actual)))
    return (f"at response token {at}: turn by turn {decode(actual[at:at + 8])!r}, "
            f"whole conversation {decode(expected[at:at + 8])!r}")
