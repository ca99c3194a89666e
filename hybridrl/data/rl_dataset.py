"""verl's RLHFDataset (`data.*` keys: `RLDatasetConfig`): prompts from verl-schema parquet files. An item
holds input_ids / attention_mask / position_ids (max_prompt_length,) with the prompt LEFT-padded,
raw_prompt_ids (the unpadded, truncated prompt), index (extra_info["index"], else 0), raw_prompt /
full_prompts when asked for, and every other column as is. Rows are checked at build time, before any
worker starts; a bad one is named by file, row and column.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from hybridrl.protocol import object_column
from hybridrl.utils.registry import load_class
from hybridrl.utils.typed_config import FreezableConfig, readonly_view

logger = logging.getLogger(__name__)

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
    """Why `prompt` is unusable (not a non-empty string or list of string role/content messages), or None."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "the prompt is an empty string"
    if not isinstance(prompt, list | tuple):
        return f"must hold a list of chat messages or a string, got {type(prompt).__name__} {_short(prompt)}"
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
    """Why a rule-based reward cannot score the row (no non-null `reward_model.ground_truth`), or None."""
    if not isinstance(reward_model, Mapping):
        return (f"must be a dict with a 'ground_truth' entry, got {type(reward_model).__name__} "
                f"{_short(reward_model)}")
    if reward_model.get("ground_truth") is None:
        return "reward_model.ground_truth is missing or null"
    return None


def read_rows_with_origins(files: str | Path | Sequence[str | Path], keys: str = "the data files"
                           ) -> tuple[list[dict[str, Any]], list[str]]:
    """All rows of one or many parquet files, and each row's "<file> row <n>" for error messages; `keys`
    names the settings that list the files."""
    paths = [files] if isinstance(files, str | Path) else list(files)
    if not paths:
        raise ValueError(f"no parquet files given: pass at least one ({keys})")
    rows: list[dict[str, Any]] = []
    origins: list[str] = []
    for path in (Path(p).expanduser() for p in paths):
        if not path.is_file():
            raise FileNotFoundError(f"data file {str(path)!r} does not exist (check {keys})")
        table = pq.read_table(path)
        rows.extend(table.to_pylist())
        origins.extend(f"{path} row {i}" for i in range(table.num_rows))
    return rows, origins


def raise_if_any(problems: list[RowProblem], total_rows: int) -> None:
    """Raise one DataError listing the first MAX_LISTED problems, the count of the rest, and each fix."""
    if not problems:
        return
    lines = [f"  {p.origin}, column {p.column}: {p.problem}" for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        lines.append(f"  ... and {len(problems) - MAX_LISTED} more")
    fixes = list(dict.fromkeys(p.fix for p in problems))  # distinct, in order of first appearance
    raise DataError(f"{len(problems)} of {total_rows} data rows cannot be used (checked before training "
                    f"starts):\n" + "\n".join(lines) + "\nFix: " + "\nFix: ".join(fixes))


TRUNCATION_MODES = ("error", "left", "right", "middle")
OVERLONG_FIX = ("set data.truncation=left|right|middle, set data.filter_overlong_prompts=True to drop such "
                "prompts, or raise data.max_prompt_length")
TOKENIZE_CHUNK = 1024  # prompts per batched tokenizer call when measuring lengths at load time


@dataclass
class RLDatasetConfig(FreezableConfig):
    """The `data.*` keys RLHFDataset reads (verl's names and defaults)."""

    # column holding the prompt: a list of chat messages, or a plain string used as-is
    prompt_key: str = "prompt"
    # prompts are left-padded (or truncated) to exactly this many tokens
    max_prompt_length: int = 512
    # what to do with a longer prompt: error | left (keep the end) | right (keep the start) | middle
    truncation: str = "error"
    # drop longer prompts when the dataset is built (logged and counted) instead of truncating them
    filter_overlong_prompts: bool = False
    # add `raw_prompt` (the chat messages) to every item, for multi-turn rollouts and reward models
    return_raw_chat: bool = False
    # add `full_prompts` (the prompt text after the chat template) to every item
    return_full_prompt: bool = False
    # extra keyword arguments for `tokenizer.apply_chat_template` (e.g. enable_thinking)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # the multi-turn tools (verl's data keys; the PPO config points them at rollout.multi_turn's): their
    # OpenAI schemas go to the chat template as `tools=`, so a template that describes tools in the
    # prompt (Qwen2.5's system message) shows them, and prompt lengths count them
    tool_config_path: str | None = None
    function_tool_path: str | None = None

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation must be one of {TRUNCATION_MODES}, got {self.truncation!r}")
        if self.max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length must be >= 1, got {self.max_prompt_length}")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any] | RLDatasetConfig | None) -> RLDatasetConfig:
        """Pick this class's keys from a `data` config section (which has many others); None gives defaults."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        known = {f.name for f in fields(cls)}
        picked = {key: config[key] for key in config if key in known}
        if "apply_chat_template_kwargs" in picked:
            picked["apply_chat_template_kwargs"] = dict(picked["apply_chat_template_kwargs"] or {})
        return cls(**picked)


def _tool_schemas(config: RLDatasetConfig) -> list[dict[str, Any]]:
    """The OpenAI function schemas of the configured tools, in load order ([] when none)."""
    if not (config.tool_config_path or config.function_tool_path):
        return []
    from hybridrl.tools.base_tool import load_all_tools

    tools = load_all_tools(config.tool_config_path, config.function_tool_path)
    return [tool.get_openai_tool_schema().model_dump(exclude_none=True) for tool in tools.values()]


def truncate(ids: list[int], max_length: int, mode: str, where: str) -> list[int]:
    """Cut a prompt to `max_length` tokens: `left` keeps the end, `right` the start, `middle` both halves;
    `error` raises, naming the row `where`."""
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head) :]
    raise ValueError(f"{where}: the prompt has {len(ids)} tokens, more than "
                     f"data.max_prompt_length={max_length}. Fix: {OVERLONG_FIX}")


def left_pad(ids: list[int], length: int, pad_token_id: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask and position_ids, each (length,), with the prompt at the right end."""
    pad = length - len(ids)
    input_ids = torch.tensor([pad_token_id] * pad + ids, dtype=torch.long, device="cpu")  # (length,)
    attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long, device="cpu")  # (length,)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=0) - 1, min=0)  # (length,)
    return input_ids, attention_mask, position_ids


def _clean_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    # parquet stores messages as structs: a key some other message has comes back as None here
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


class RLHFDataset(Dataset):
    """Prompts from one or many parquet files, in file order; `require_ground_truth` for rule-based rewards."""

    def __init__(self, data_files: str | Path | Sequence[str | Path], tokenizer: PreTrainedTokenizerBase,
                 config: Mapping[str, Any] | RLDatasetConfig | None = None, processor: Any = None, *,
                 require_ground_truth: bool = False) -> None:
        if processor is not None:
            raise NotImplementedError("multi-modal prompts (processor=...) are not supported yet")
        self.config = RLDatasetConfig.from_mapping(config)
        self.tokenizer = tokenizer
        self.tool_schemas = _tool_schemas(self.config)
        pad = tokenizer.pad_token_id
        self.pad_token_id = tokenizer.eos_token_id if pad is None else pad
        if self.pad_token_id is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token to left-pad prompts")
        files = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
        if not files:
            raise ValueError("data_files is empty: pass at least one parquet file (data.train_files)")
        self.data_files = [Path(f).expanduser() for f in files]
        self.rows: list[dict[str, Any]] = []
        self.origins: list[str] = []  # "file row N" per row, for error messages
        for path in self.data_files:
            self._read(path, require_ground_truth)
        self._check_rows(require_ground_truth)
        self.num_filtered = 0
        if self.config.filter_overlong_prompts:
            self._filter_overlong()
        elif self.config.truncation == "error":
            self._check_lengths()

    def _read(self, path: Path, require_ground_truth: bool) -> None:
        rows, origins = read_rows_with_origins(path, "data.train_files / data.val_files")
        if not rows:
            raise ValueError(f"{path} has no rows; regenerate it or drop it from data.train_files")
        columns = list(rows[0])
        if self.config.prompt_key not in columns:
            raise KeyError(f"{path} has no column {self.config.prompt_key!r} (data.prompt_key); its columns "
                           f"are {columns}")
        if require_ground_truth and "reward_model" not in columns:
            raise KeyError(f"{path} has no column 'reward_model', where rule-based rewards read each row's "
                           f"ground_truth; its columns are {columns}. Fix: {GROUND_TRUTH_FIX}")
        self.rows += rows
        self.origins += origins

    def _prompt_text(self, prompt: Any, where: str) -> tuple[str, bool]:
        """The text to tokenise and whether special tokens still need adding (raw strings only)."""
        if isinstance(prompt, str):
            return prompt, True
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{where}: the prompt is a list of chat messages but the tokenizer has no "
                             f"chat_template; use a tokenizer with one, or store the prompt as a plain "
                             f"string")
        tools = {"tools": self.tool_schemas} if self.tool_schemas else {}
        text = self.tokenizer.apply_chat_template(_clean_messages(prompt), add_generation_prompt=True,
                                                  tokenize=False, **tools,
                                                  **self.config.apply_chat_template_kwargs)
        return text, False  # the chat template already placed its own special tokens

    def _check_rows(self, require_ground_truth: bool) -> None:
        """Raise one DataError listing the rows whose prompt (or required ground truth) is unusable."""
        key, problems = self.config.prompt_key, []
        for row, origin in zip(self.rows, self.origins, strict=True):
            problem = prompt_problem(row[key])
            if problem is not None:
                problems.append(RowProblem(origin, repr(key), problem, PROMPT_FIX))
            problem = ground_truth_problem(row["reward_model"]) if require_ground_truth else None
            if problem is not None:
                problems.append(RowProblem(origin, "'reward_model'", problem, GROUND_TRUTH_FIX))
        raise_if_any(problems, len(self.rows))
        if not getattr(self.tokenizer, "chat_template", None):
            chat = next((i for i, row in enumerate(self.rows) if not isinstance(row[key], str)), None)
            if chat is not None:
                self._prompt_text(self.rows[chat][key], self.origins[chat])  # raises naming the row

    def prompt_lengths(self) -> list[int]:
        """Every prompt's token count, tokenised in batches."""
        texts = [self._prompt_text(row[self.config.prompt_key], origin)
                 for row, origin in zip(self.rows, self.origins, strict=True)]
        lengths = [0] * len(texts)
        for add_special in (True, False):  # raw strings get special tokens; templated chats have them
            picked = [i for i, (_, special) in enumerate(texts) if special == add_special]
            for start in range(0, len(picked), TOKENIZE_CHUNK):
                chunk = picked[start : start + TOKENIZE_CHUNK]
                ids = self.tokenizer([texts[i][0] for i in chunk], add_special_tokens=add_special)["input_ids"]
                for i, row_ids in zip(chunk, ids, strict=True):
                    lengths[i] = len(row_ids)
        return lengths

    def _check_lengths(self) -> None:
        """Under truncation=error, every prompt must fit max_prompt_length."""
        limit = self.config.max_prompt_length
        problems = [RowProblem(origin, repr(self.config.prompt_key),
                               f"the prompt has {length} tokens, more than data.max_prompt_length={limit}",
                               OVERLONG_FIX)
                    for origin, length in zip(self.origins, self.prompt_lengths(), strict=True)
                    if length > limit]
        raise_if_any(problems, len(self.rows))

    def _filter_overlong(self) -> None:
        lengths = self.prompt_lengths()
        keep = [i for i, length in enumerate(lengths) if length <= self.config.max_prompt_length]
        self.num_filtered = len(self.rows) - len(keep)
        logger.info("filtered %d of %d prompts longer than max_prompt_length=%d", self.num_filtered,
                    len(self.rows), self.config.max_prompt_length)
        if not keep:
            raise ValueError(f"every prompt in {[str(p) for p in self.data_files]} is longer than "
                             f"data.max_prompt_length={self.config.max_prompt_length}; raise it")
        self.rows = [self.rows[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row, key = self.rows[index], self.config.prompt_key
        text, add_special = self._prompt_text(row[key], self.origins[index])
        ids = truncate(list(self.tokenizer(text, add_special_tokens=add_special)["input_ids"]),
                       self.config.max_prompt_length, self.config.truncation, self.origins[index])
        input_ids, attention_mask, position_ids = left_pad(ids, self.config.max_prompt_length,
                                                           self.pad_token_id)
        item = {name: value for name, value in row.items() if name != key}
        item.update(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    raw_prompt_ids=ids)
        if self.config.return_raw_chat:
            item["raw_prompt"] = row[key] if isinstance(row[key], str) else _clean_messages(row[key])
        if self.config.return_full_prompt:
            item["full_prompts"] = text
        extra_info = row.get("extra_info")
        item["index"] = extra_info.get("index", 0) if isinstance(extra_info, Mapping) else 0
        return item


def collate_fn(data_list: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Tensors stacked to (batch, ...), everything else in 1-D object arrays (one list per row even when lists
    have equal lengths): what `DataProto.from_single_dict` takes."""
    if not data_list:
        raise ValueError("collate_fn got an empty batch")
    keys = list(data_list[0])
    for i, item in enumerate(data_list):
        if set(item) != set(keys):
            raise KeyError(f"batch item {i} has keys {sorted(item)}, item 0 has {sorted(keys)}; every data "
                           f"file in one dataset needs the same columns")
    columns = {key: [item[key] for item in data_list] for key in keys}
    return {key: torch.stack(values) if isinstance(values[0], torch.Tensor) else object_column(values)
            for key, values in columns.items()}


def build_rl_dataset(data_files: Any, tokenizer: PreTrainedTokenizerBase, data_config: Any, *,
                     require_ground_truth: bool = False) -> Dataset:
    """An `RLHFDataset` of `data_files`, or the class `data.custom_cls` names, built as verl builds it:
    cls(data_files=..., tokenizer=..., config=<data.* read-only>, processor=None) (+ require_ground_truth for
    a subclass of RLHFDataset)."""
    if data_config.custom_cls.path is None:
        return RLHFDataset(data_files, tokenizer, data_config, require_ground_truth=require_ground_truth)
    cls = load_class(data_config.custom_cls.path, data_config.custom_cls.name, "data.custom_cls.path", Dataset)
    ours = {"require_ground_truth": require_ground_truth} if issubclass(cls, RLHFDataset) else {}
    return cls(data_files=data_files, tokenizer=tokenizer, config=readonly_view(data_config), processor=None, **ours)
