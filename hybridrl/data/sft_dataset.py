"""SFT data in verl's layouts: prompt / response columns (`*_dict_keys` walk into dict columns) or a
`messages_key` column of chats. Items hold right-padded (max_length,) `input_ids`, `attention_mask`,
`position_ids` (padding repeats the last position) and `loss_mask`: 1 on the tokens an assistant turn writes,
its end-of-turn token included, its role header and trailing newline not; `loss_mask[t]` is about token t
itself, as in verl. Assistant spans come from rendering chat prefixes (the template must render a shorter
chat as a prefix of a longer one: checked).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from hybridrl.data.rl_dataset import RowProblem, raise_if_any, read_rows_with_origins

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right")
Message = dict[str, Any]


def read_parquet_rows(files: str | Path | Sequence[str | Path]) -> list[dict[str, Any]]:
    """All rows of one or many parquet files, as Python dicts (nested lists / dicts kept)."""
    return read_rows_with_origins(files)[0]


def _lookup(row: Mapping[str, Any], where: str, key: str, dict_keys: Sequence[str]) -> Any:
    """`row[key][dict_keys[0]][dict_keys[1]]...`, with errors naming the row and the missing key."""
    if key not in row:
        raise KeyError(f"column {key!r} not found; columns are {sorted(row)}")
    value, path = row[key], key
    for dict_key in dict_keys:
        if not isinstance(value, Mapping) or value.get(dict_key) is None:
            found = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise KeyError(f"{where}: {path}[{dict_key!r}] is missing or null (found {found})")
        value, path = value[dict_key], f"{path}[{dict_key!r}]"
    return value


def _check_messages(messages: Any, where: str, field: str) -> list[Message]:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: {field} must be a non-empty list of chat messages, got "
                         f"{type(messages).__name__}")
    for turn, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"{where}: {field}[{turn}] must be a dict with a string 'role', got {message!r}")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"{where}: {field}[{turn}]['content'] must be a string, got "
                             f"{message.get('content')!r}")
    return [dict(message) for message in messages]


def assistant_spans(tokenizer: PreTrainedTokenizerBase, messages: list[Message], **template_kwargs: Any
                    ) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the [start, end) character spans written by its assistant turns."""

    def render(chat: list[Message], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt,
                                             **template_kwargs)

    if messages[0]["role"] == "assistant":
        # no earlier text to render, so the turn's start cannot be located
        raise ValueError("a chat must not start with an assistant turn; put a user or system message first")
    text = render(messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(messages[:i], True), render(messages[: i + 1], False)
        if not (through.startswith(before) and text.startswith(through)):
            raise ValueError("the chat template does not render a chat's beginning as a prefix of the whole "
                             "chat, so assistant tokens cannot be located; use a template that renders turns "
                             "independently")
        # rstrip: the newline after the end-of-turn token is never generated
        spans.append((len(before), len(through.rstrip())))
    return text, spans


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: list[Message], **template_kwargs: Any
                ) -> tuple[list[int], list[int]]:
    """Token ids of the rendered chat and the 0/1 mask of tokens written by assistant turns."""
    text, spans = assistant_spans(tokenizer, messages, **template_kwargs)
    # the chat template wrote BOS already
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(lo <= start < hi for lo, hi in spans)) for start, _ in encoding["offset_mapping"]]
    return list(encoding["input_ids"]), mask


# tokens of encoded rows kept for later epochs, which would otherwise re-render the chats
ENCODED_CACHE_TOKENS = 64 * 2**20


class SFTDataset(Dataset):
    """Chats from parquet files for SFT. Over `max_length`, `truncation` "error" refuses the files at build
    time, naming the rows; "left" / "right" keep the end / the start."""

    def __init__(self, parquet_files: str | Path | Sequence[str | Path], tokenizer: PreTrainedTokenizerBase,
                 *, prompt_key: str = "prompt", prompt_dict_keys: Sequence[str] | None = None,
                 response_key: str = "response", response_dict_keys: Sequence[str] | None = None,
                 messages_key: str | None = None, max_length: int = 1024, truncation: str = "error",
                 apply_chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; load it with hybridrl.models.load_tokenizer")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation = truncation
        self.template_kwargs = dict(apply_chat_template_kwargs or {})
        rows, self.origins = read_rows_with_origins(parquet_files)
        if messages_key is not None:
            self.columns = repr(messages_key)
            self.chats = [_check_messages(_lookup(r, where, messages_key, ()), where, messages_key)
                          for r, where in zip(rows, self.origins, strict=True)]
        else:
            self.columns = f"{prompt_key!r} + {response_key!r}"
            keys = (prompt_key, list(prompt_dict_keys or ()), response_key, list(response_dict_keys or ()))
            self.chats = [self._prompt_response_chat(row, where, *keys)
                          for row, where in zip(rows, self.origins, strict=True)]
        for where, chat in zip(self.origins, self.chats, strict=True):
            if not any(message["role"] == "assistant" for message in chat):
                raise ValueError(f"{where} has no assistant message, so it has nothing to train on")
        if truncation == "error":
            self._check_lengths()
        self._warn_if_turns_lack_eos()
        self._encoded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # index -> (ids, loss mask), unpadded
        self._encoded_tokens = 0

    def _check_lengths(self) -> None:
        """Under truncation="error", every chat must fit max_length (the chats tokenised in one batch)."""
        texts = [self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False,
                                                    **self.template_kwargs) for chat in self.chats]
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        fix = "raise data.max_length, or set data.truncation=left (keep the end) or right (keep the start)"
        problems = [RowProblem(where, self.columns, f"the chat has {length} tokens, more than "
                                                    f"max_length={self.max_length}", fix)
                    for where, length in zip(self.origins, lengths, strict=True) if length > self.max_length]
        raise_if_any(problems, len(self.chats))

    def _warn_if_turns_lack_eos(self) -> None:
        """A template that closes assistant turns without EOS trains a model that never stops generating."""
        if not self.chats or self.tokenizer.eos_token is None:
            return
        text, spans = assistant_spans(self.tokenizer, self.chats[0], **self.template_kwargs)
        if not all(self.tokenizer.eos_token in text[lo:hi] for lo, hi in spans):
            logger.warning("the chat template ends assistant turns without the EOS token %r, so a model "
                           "trained on this data does not learn to stop; use a template whose assistant "
                           "turns end with it", self.tokenizer.eos_token)

    @staticmethod
    def _prompt_response_chat(row: Mapping[str, Any], where: str, prompt_key: str,
                              prompt_dict_keys: list[str], response_key: str,
                              response_dict_keys: list[str]) -> list[Message]:
        prompt = _lookup(row, where, prompt_key, prompt_dict_keys)
        response = _lookup(row, where, response_key, response_dict_keys)
        field = prompt_key + "".join(f"[{k!r}]" for k in prompt_dict_keys)
        chat = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else \
            _check_messages(prompt, where, field)
        if not isinstance(response, str):
            raise ValueError(f"{where}: the response ({response_key}) must be a string, got "
                             f"{type(response).__name__}")
        return [*chat, {"role": "assistant", "content": response}]

    def __len__(self) -> int:
        return len(self.chats)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, loss_mask = self._encode(index)
        pad = self.max_length - len(ids)
        attention_mask = F.pad(torch.ones(len(ids), dtype=torch.long), (0, pad))
        return {"input_ids": F.pad(ids.long(), (0, pad), value=self.tokenizer.pad_token_id),
                "attention_mask": attention_mask,
                "position_ids": torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0),
                "loss_mask": F.pad(loss_mask.long(), (0, pad))}

    def _encode(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row `index`'s token ids and loss mask, fitted to max_length, unpadded, and kept while they fit."""
        kept = self._encoded.get(index)
        if kept is not None:
            return kept
        ids, loss_mask = encode_chat(self.tokenizer, self.chats[index], **self.template_kwargs)
        if len(ids) > self.max_length:  # truncation="error" refused longer chats in __init__
            keep = slice(-self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, loss_mask = ids[keep], loss_mask[keep]
        encoded = torch.tensor(ids, dtype=torch.int32), torch.tensor(loss_mask, dtype=torch.uint8)
        if self._encoded_tokens + len(ids) <= ENCODED_CACHE_TOKENS:
            self._encoded[index] = encoded
            self._encoded_tokens += len(ids)
        return encoded
