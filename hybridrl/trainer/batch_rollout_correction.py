"""Rollout correction on a training batch: what `algorithm.rollout_correction` does to a PPO step.

The rollout engine samples with its own numerics (vLLM kernels, bf16), so its `rollout_log_probs` differ
from the actor's `old_log_probs` for the same weights. Decoupled mode reweights and rejects tokens on
that difference once per step, after the old log-prob pass; bypass mode skips the pass, trains against the
rollout's log-probs directly and corrects inside the actor's loss (hybridrl/algos/bypass_loss.py). The
tensor arithmetic lives in `hybridrl.algos.rollout_correction`.
"""

from __future__ import annotations

import torch

from hybridrl.algos.rollout_correction import compute_rollout_correction
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo_config import ROLLOUT_CORRECTION_KEY, RolloutCorrectionConfig


def rollout_log_probs(batch: DataProto, why: str) -> torch.Tensor:
    """The rollout engine's log-probs of the sampled tokens, (batch, response_len); a clear error without them."""
    if "rollout_log_probs" not in batch.batch:
        raise KeyError(
            f"{why} needs the batch column 'rollout_log_probs' (the rollout engine's log-prob of each sampled "
            f"token), which this rollout did not return; use a rollout engine that returns them (hf, vllm) or "
            f"set {ROLLOUT_CORRECTION_KEY}.rollout_is=null, rollout_rs=null and bypass_mode=false"
        )
    return batch.batch["rollout_log_probs"]


def correct_rollout(batch: DataProto, config: RolloutCorrectionConfig) -> dict[str, float]:
    """Decoupled mode, in place: `rollout_is_weights` (batch, response_len) join the batch when
    `config.rollout_is` is set, and `response_mask` loses the tokens rejection sampling drops. Returns the
    `rollout_corr/*` metrics (weights, rejected shares, KL and perplexities of rollout vs trainer)."""
    where = f"{ROLLOUT_CORRECTION_KEY}.rollout_is / rollout_rs"
    weights, mask, metrics = compute_rollout_correction(
        batch.batch["old_log_probs"], rollout_log_probs(batch, where), batch.batch["response_mask"],
        rollout_is=config.rollout_is, rollout_is_threshold=config.rollout_is_threshold,
        rollout_is_batch_normalize=config.rollout_is_batch_normalize, rollout_rs=config.rollout_rs,
        rollout_rs_threshold=config.rollout_rs_threshold,
    )
    if weights is not None:
        batch.batch["rollout_is_weights"] = weights
    batch.batch["response_mask"] = mask
    return metrics


def bypass_old_log_probs(batch: DataProto) -> None:
    """Bypass mode, in place: `old_log_probs` are the rollout's, so the PPO ratio is pi_theta / pi_rollout."""
    batch.batch["old_log_probs"] = rollout_log_probs(batch, f"{ROLLOUT_CORRECTION_KEY}.bypass_mode=true").clone()


def bypass_metric_names(actor_metrics: dict[str, float]) -> dict[str, float]:
    """The actor's metrics with bypass mode's in-loss `actor/rollout_corr/*` filed under `rollout_corr/*`,
    where decoupled mode reports them. They are means over micro-batches (weighted by tokens), so a
    `_max` / `_min` is the mean of the micro-batches' maxima / minima."""
    prefix = "actor/rollout_corr/"
    return {name.removeprefix("actor/") if name.startswith(prefix) else name: value
            for name, value in actor_metrics.items()}
