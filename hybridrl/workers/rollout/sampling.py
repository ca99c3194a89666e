"""Per-call sampling settings and the token sampler shared by the rollout engines.

Tokens are drawn after, in Hugging Face's and vLLM's order: temperature; top-k (boundary ties kept); top-p
(the smallest most-likely prefix reaching mass p); log_softmax over the kept tokens. `rollout_log_probs` are
log-probs under exactly that distribution (greedy: the plain log_softmax).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridrl.workers.config import RolloutConfig, ValKwargs
from hybridrl.workers.rollout.base import eos_token_ids as merged_ids

# meta_info keys a caller may set to change one call's sampling (verl's names).
CALL_OVERRIDES = ("do_sample", "temperature", "top_k", "top_p", "n", "eos_token_id", "seed", "validate",
                  "response_length")


@dataclass(frozen=True)
class SamplingParams:
    """The resolved settings of one `generate_sequences` call."""

    greedy: bool
    temperature: float
    top_k: int  # <= 0: off
    top_p: float  # 1.0: off
    n: int
    response_length: int
    stop_token_ids: tuple[int, ...]
    seed: int | None  # None: continue the engine's generator


def resolve_sampling_params(
    config: RolloutConfig, meta_info: Mapping[str, Any], eos_token_ids: Sequence[int]
) -> SamplingParams:
    """The config merged with a call's meta_info overrides (`CALL_OVERRIDES`): `validate=True` takes
    `config.val_kwargs`; `do_sample=False` is greedy with one sample per prompt (as in verl); `eos_token_id`
    replaces the engine's EOS ids; `seed` restarts the sampler; `response_length` shortens this call."""
    base: RolloutConfig | ValKwargs = config.val_kwargs if meta_info.get("validate", False) else config
    do_sample = bool(meta_info.get("do_sample", base.do_sample))
    temperature = float(meta_info.get("temperature", base.temperature))
    top_k = int(meta_info.get("top_k", base.top_k))
    top_p = float(meta_info.get("top_p", base.top_p))
    n = int(meta_info.get("n", base.n if do_sample else 1))
    if temperature < 0 or not 0.0 < top_p <= 1.0 or n < 1:
        raise ValueError(
            f"meta_info sampling overrides out of range: temperature={temperature} (>= 0), "
            f"top_p={top_p} (in (0, 1]), n={n} (>= 1)"
        )
    response_length = int(meta_info.get("response_length", config.response_length))
    if not 1 <= response_length <= config.response_length:
        raise ValueError(f"meta_info response_length={response_length} must be in [1, rollout.response_length="
                         f"{config.response_length}]")
    eos = merged_ids(meta_info["eos_token_id"]) if "eos_token_id" in meta_info else list(eos_token_ids)
    stops = merged_ids([] if config.ignore_eos else eos, config.stop_token_ids)
    seed = meta_info.get("seed")
    return SamplingParams(
        greedy=(not do_sample) or temperature == 0.0,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        n=n,
        response_length=response_length,
        stop_token_ids=tuple(stops),
        seed=None if seed is None else int(seed),
    )


def processed_log_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Log-probs of the sampling distribution: (rows, vocab) logits -> (rows, vocab), -inf where filtered."""
    scores = logits.float() / temperature if temperature != 1.0 else logits.float()
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # (rows, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)  # (rows, vocab)
        probs = torch.softmax(sorted_scores, dim=-1)
        # mass strictly before each token; a token is kept while that mass is still below top_p
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row: (rows, vocab) logits -> tokens (rows,), their log-probs (rows,)."""
    if params.greedy:
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (rows, vocab)
        tokens = torch.argmax(logits, dim=-1)  # (rows,), on the raw logits as model.generate does
    else:
        log_probs = processed_log_probs(logits, params.temperature, params.top_k, params.top_p)
        tokens = draw_tokens(log_probs.exp(), generator)  # (rows,)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def draw_tokens(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of (rows, vocab) probabilities, by inverting each row's CDF at one uniform draw
    (`torch.multinomial`'s distribution, cheaper on a CPU); the draw stays below the row's total mass."""
    cdf = probs.cumsum(dim=-1)  # (rows, vocab)
    total = cdf[:, -1:]  # (rows, 1)
    uniform = torch.rand(total.shape, generator=generator, device=probs.device, dtype=cdf.dtype)
    below_total = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, below_total, right=True).squeeze(-1)  # (rows,)
    # NaN probabilities index past the vocabulary: a CPU raises; a GPU clamps (a check would sync every step)
    if probs.device.type == "cpu" and not bool((torch.isfinite(total) & (total > 0)).all()):
        raise ValueError("sampling: a row's next-token probabilities are NaN, infinite or all zero; the model's "
                         "logits are not finite (its weights may have diverged)")
    return tokens.clamp_(max=probs.shape[-1] - 1)


@dataclass
class DecodeOutputs:
    """The buffers both HF decoding loops fill."""

    responses: torch.Tensor  # (rows, R) sampled token ids; after a row's stop, overwritten by `finish`
    log_probs: torch.Tensor  # (rows, R) fp32 log-probs of the sampled tokens
    lengths: torch.Tensor  # (rows,) tokens up to and including the stop token; R if none
    stop_ids: torch.Tensor  # (S,) the ids that end a response
    pad_token_id: int

    @classmethod
    def allocate(cls, rows: int, width: int, params: SamplingParams, pad_token_id: int, token_dtype: torch.dtype,
                 device: torch.device) -> DecodeOutputs:
        return cls(
            responses=torch.full((rows, width), pad_token_id, dtype=token_dtype, device=device),
            log_probs=torch.zeros(rows, width, dtype=torch.float32, device=device),
            lengths=torch.full((rows,), width, dtype=torch.long, device=device),
            stop_ids=torch.tensor(params.stop_token_ids, dtype=token_dtype, device=device),
            pad_token_id=pad_token_id,
        )

    def record(self, rows: torch.Tensor | slice, step: int, tokens: torch.Tensor,
               token_log_probs: torch.Tensor) -> None:
        """Column `step` of output rows `rows` (indices, or `slice(None)`); `finish` pads over finished rows."""
        self.responses[rows, step] = tokens
        self.log_probs[rows, step] = token_log_probs

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """responses (rows, R) padded after each row's length, lengths (rows,), log-probs (rows, R)."""
        width = self.responses.shape[1]
        after_stop = torch.arange(width, device=self.responses.device)[None, :] >= self.lengths[:, None]
        self.responses.masked_fill_(after_stop, self.pad_token_id)
        return self.responses, self.lengths, self.log_probs
