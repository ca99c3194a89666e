"""The reward model worker (`reward_model.*`): a token- or sequence-classification model read at each
sequence's last valid token. With a different tokenizer or chat template (`model.input_tokenizer`), rows
are decoded with the actor's and re-templated for the reward model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from hybridrl.controller import Dispatch, Worker, register
from hybridrl.models.loading import load_tokenizer, load_value_model, resolve_model_dir
from hybridrl.protocol import DataProto
from hybridrl.rewards.failures import DEFAULT_MAX_FAILURE_SHARE, DEFAULT_TIMEOUT_S
from hybridrl.rewards.managers import OverlongBufferConfig
from hybridrl.rewards.sandbox import SandboxLimits
from hybridrl.utils.typed_config import ConfigError, FreezableConfig
from hybridrl.workers.config import RewardModelModelConfig, to_dataclass
from hybridrl.workers.fsdp_engine import FSDPEngine, load_model_for, offload_refusals, refuse_offload
from hybridrl.workers.micro_batch import make_micro_batches, restore_order
from hybridrl.workers.update_loop import forward_batching

logger = logging.getLogger(__name__)

STRATEGIES = ("fsdp", "fsdp2")  # both mean FSDP2 (`fully_shard`) here, as in the actor and critic


@dataclass
class SandboxConfig(FreezableConfig):
    """`reward_model.sandbox.*`: how the built-in code scorer runs programs (hybridrl/rewards/SANDBOX.md)."""

    # true: programs run only fully isolated (namespaces + a throwaway uid); a host that refuses namespaces
    # stops the run at start. false: there, accept the weaker uid-only mode (no network isolation).
    require_isolation: bool = True

    def limits(self) -> SandboxLimits:
        return SandboxLimits(require_isolation=self.require_isolation)


@dataclass
class RewardModelConfig(FreezableConfig):
    """`reward_model.*`: the optional reward model worker plus the rule-based reward manager's settings."""

    # Score responses with the reward model; False uses only rule-based / custom reward functions.
    enable: bool = False
    # Run the reward model on a pool of its own (`nnodes` x `n_gpus_per_node`; docs/placement.md).
    enable_resource_pool: bool = False
    n_gpus_per_node: int = 0
    nnodes: int = 0
    # fsdp | fsdp2 (both run FSDP2 here).
    strategy: str = "fsdp"
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    # verl's older global micro-batch size; divided by the world size when the per-GPU value is unset.
    micro_batch_size: int | None = None
    # Rows per forward pass on one rank; None (and no dynamic batching) runs a rank's share at once.
    micro_batch_size_per_gpu: int | None = None
    # Longest re-tokenised sequence the reward model reads (longer ones lose their end); None: no limit.
    max_length: int | None = None
    # Cut micro-batches by a token budget (rows x padded width) instead of a row count.
    use_dynamic_bsz: bool = False
    forward_max_token_len_per_gpu: int = 32768
    # Only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    ulysses_sequence_parallel_size: int = 1
    # Rule-based reward manager: naive | batch | prime | dapo (or one you register).
    reward_manager: str = "naive"
    # Extra keyword arguments for the reward manager's constructor.
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    # Seconds one call of the reward function may take (one response; the whole batch for the `batch`
    # manager). A call past it is killed, its rows score 0.0 and count in `reward/timeouts`.
    reward_fn_timeout: float = DEFAULT_TIMEOUT_S
    # Worker processes that run the reward function (null: the CPUs this process may use, at most 64).
    # 0 runs it in the driver: no timeout, and an os._exit or segfault in it ends the run.
    reward_fn_workers: int | None = None
    # Stop the run when more than this share of a batch's rows fail; failures up to it score 0.0 (`reward/*`).
    max_failure_share: float = DEFAULT_MAX_FAILURE_SHARE
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # Score in a driver thread while the workers recompute log-probs (not with algorithm.filter_groups).
    launch_reward_fn_async: bool = False
    # How the built-in code scorer runs programs (require_isolation; see hybridrl/rewards/SANDBOX.md).
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # verl's choice between its reward loop and its legacy reward worker: both score the same here.
    use_reward_loop: bool = True
    # verl's reward-loop workers, reward model server and remote code sandbox: no effect here (warned).
    num_workers: int = 1
    rollout: dict[str, Any] = field(default_factory=dict)
    sandbox_fusion: dict[str, Any] = field(default_factory=dict)
    profiler: dict[str, Any] = field(default_factory=dict)


def check_reward_model(config: RewardModelConfig, world_size: int) -> None:
    """Raise, naming the key, on a setting the worker cannot run at this world size."""
    if config.strategy not in STRATEGIES:
        raise ConfigError(f"reward_model.strategy must be one of {STRATEGIES}, got {config.strategy!r} "
                          f"(megatron is not supported)")
    if config.max_length is not None and config.max_length <= 0:
        raise ConfigError(f"reward_model.max_length must be positive or null, got {config.max_length}")
    if not config.model.path:
        raise ConfigError("the reward model worker needs reward_model.model.path=<local reward model directory>")
    score_batching(config, world_size)


def score_batching(config: RewardModelConfig, world_size: int) -> tuple[int | None, int | None]:
    """Forward batching of the scoring pass at this world size."""
    return forward_batching(config.use_dynamic_bsz, config.micro_batch_size_per_gpu, config.micro_batch_size,
                            world_size, "reward_model.micro_batch_size", config.forward_max_token_len_per_gpu)


def same_tokenization(a: Any, b: Any) -> bool:
    """True when token ids from `a` mean the same to `b`: same vocabulary and the same chat template."""
    return a.get_vocab() == b.get_vocab() and a.chat_template == b.chat_template


def conversations(data: DataProto, src_tokenizer: Any) -> list[list[dict[str, Any]]]:
    """Each row as chat messages: its prompt (`raw_prompt`, else decoded without special tokens, keeping any
    text the actor's template added) and the response."""
    prompts, responses = data.batch["prompts"], data.batch["responses"]  # (B, P), (B, R)
    prompt_len, response_len = prompts.shape[-1], responses.shape[-1]
    mask = data.batch["attention_mask"]
    prompt_valid, response_valid = mask[:, :prompt_len].sum(-1), mask[:, -response_len:].sum(-1)  # (B,)
    raw = data.non_tensor_batch.get("raw_prompt")
    chats = []
    for i in range(len(data)):
        if raw is not None and isinstance(raw[i], str):
            messages = [{"role": "user", "content": raw[i]}]
        elif raw is not None:
            messages = [dict(message) for message in raw[i]]
        else:
            ids = prompts[i, prompt_len - int(prompt_valid[i]):].tolist()
            messages = [{"role": "user", "content": src_tokenizer.decode(ids, skip_special_tokens=True)}]
        response = src_tokenizer.decode(responses[i, :int(response_valid[i])].tolist(), skip_special_tokens=True)
        chats.append([*messages, {"role": "assistant", "content": response}])
    return chats


def retokenize_for_reward_model(chats: Sequence[list[dict[str, Any]]], rm_tokenizer: Any,
                                max_length: int | None) -> DataProto:
    """Right-padded reward-model inputs for the conversations, in its chat template; sequences over
    `max_length` lose their end, with a warning (one overlong sample must not stop a run)."""
    texts = [rm_tokenizer.apply_chat_template(chat, tokenize=False) for chat in chats]
    ids = [rm_tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]  # the template adds them
    longest = max(len(row) for row in ids)
    if max_length is not None and longest > max_length:
        over = sum(len(row) > max_length for row in ids)
        logger.warning("reward_model.max_length=%d truncates %d of %d re-tokenised sequences (longest %d "
                       "tokens); their scores see only the start of the response", max_length, over,
                       len(ids), longest)
        ids = [row[:max_length] for row in ids]
        longest = max_length
    # padded positions are masked, so any id serves where the tokenizer names no pad token
    pad = next((i for i in (rm_tokenizer.pad_token_id, rm_tokenizer.eos_token_id) if i is not None), 0)
    input_ids = torch.tensor([row + [pad] * (longest - len(row)) for row in ids], dtype=torch.long)  # (B, L)
    attention_mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in ids], dtype=torch.long)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask,
                                "position_ids": position_ids})


def last_valid_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Column of each row's last real token, for left, right or both-sides padding. (B, L) -> (B,)."""
    columns = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (attention_mask.long() * columns).argmax(dim=-1)


def _forward_scores(module: torch.nn.Module, micro: DataProto) -> torch.Tensor:
    """Head output at each row's last valid token, on the columns where some row has a token. (rows,)"""
    mask = micro.batch["attention_mask"]
    used = mask.any(dim=0).nonzero().squeeze(-1)
    if used.numel() == 0:  # no row has a token: nothing to score (place_on_last_response_token skips such rows)
        return torch.zeros(len(mask), device=mask.device)
    cols = slice(int(used[0]), int(used[-1]) + 1)
    output = module(input_ids=micro.batch["input_ids"][:, cols], attention_mask=mask[:, cols],
                    position_ids=micro.batch["position_ids"][:, cols], use_cache=False)
    logits = output.logits[..., 0]  # (rows, kept_width)
    last = last_valid_index(mask[:, cols])
    return logits.gather(-1, last[:, None])[:, 0].float()


@torch.no_grad()
def sequence_scores(module: torch.nn.Module, inputs: DataProto, micro_batch_rows: int | None,
                    max_token_len: int | None) -> torch.Tensor:
    """One score per row of `inputs` (input_ids, attention_mask, position_ids), micro-batched. (B,)"""
    module.eval()
    micro_batches = make_micro_batches(inputs, micro_batch_rows, max_token_len)
    parts = [_forward_scores(module, mb.data) for mb in micro_batches]
    return restore_order(parts, micro_batches, len(inputs))


def place_on_last_response_token(scores: torch.Tensor, attention_mask: torch.Tensor,
                                 response_length: int) -> torch.Tensor:
    """(B,) scores -> (B, response_length) on each row's last valid response token (an empty response stays 0)."""
    valid = attention_mask[:, -response_length:].sum(dim=-1).long()  # (B,)
    out = torch.zeros((len(scores), response_length), dtype=torch.float32, device=scores.device)  # (B, R)
    rows = (valid > 0).nonzero().squeeze(-1)
    out[rows, valid[rows] - 1] = scores[rows].float()
    return out


def _has_trained_head(model_dir: Path) -> bool:
    """Whether the checkpoint holds the scalar `score` head (else it is initialised at random)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = json.loads(index.read_text())["weight_map"]
    elif (model_dir / "model.safetensors").is_file():
        with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
            names = list(f.keys())
    else:
        return True  # .bin checkpoints: not inspected, transformers reports missing weights itself
    return any(name == "score.weight" or name.endswith(".score.weight") for name in names)


class RewardModelWorker(Worker):
    """The reward model on one rank: `compute_rm_score` on this rank's rows."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = to_dataclass(RewardModelConfig, config)
        check_reward_model(self.config, self.world_size)
        refuse_offload(offload_refusals(self.config.model.fsdp_config, "reward_model.model", self.device.type))
        self.module = None
        self._warned_no_raw_prompt = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_cfg = self.config.model
        self.tokenizer = load_tokenizer(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
        self.input_tokenizer = None
        if model_cfg.input_tokenizer:
            source = load_tokenizer(model_cfg.input_tokenizer, trust_remote_code=model_cfg.trust_remote_code)
            if not same_tokenization(source, self.tokenizer):
                self.input_tokenizer = source
        model_dir = resolve_model_dir(model_cfg.path)
        if not _has_trained_head(model_dir):
            logger.warning("reward_model.model.path=%s has no trained 'score' head; its scores come from a "
                           "randomly initialised one", model_dir)
        model = load_model_for(model_cfg, False, model_cfg.fsdp_config.mixed_precision.param_dtype,
                               self.device.type, loader=load_value_model, weights_dtype=model_cfg.fsdp_config.model_dtype)
        self.module = FSDPEngine(model, model_cfg.fsdp_config).module

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` (B, response_len): each sequence's score on its last valid response token."""
        if self.module is None:
            raise RuntimeError("compute_rm_score called before init_model")
        cfg = self.config
        if self.input_tokenizer is not None:
            if "raw_prompt" not in data.non_tensor_batch and not self._warned_no_raw_prompt:
                logger.warning("no raw_prompt in the batch: the reward model gets prompts decoded from token "
                               "ids; set data.return_raw_chat=True to give it the original chat messages")
                self._warned_no_raw_prompt = True
            inputs = retokenize_for_reward_model(conversations(data, self.input_tokenizer), self.tokenizer,
                                                 cfg.max_length)
            inputs = inputs.to(data.batch["input_ids"].device)  # made from token lists, on the CPU
        else:
            inputs = data.select(batch_keys=["input_ids", "attention_mask", "position_ids"],
                                 non_tensor_batch_keys=[], meta_info_keys=[])
        rows, tokens = score_batching(cfg, self.world_size)
        scores = sequence_scores(self.module, inputs, rows, tokens)  # (B,)
        rm_scores = place_on_last_response_token(scores, data.batch["attention_mask"],
                                                 data.batch["responses"].shape[-1])
        return DataProto.from_dict({"rm_scores": rm_scores})

