"""Agreement between the rollout's log-probs and the trainer's recomputed ones.

With the same weights and precision, `rollout_log_probs` (from the sampler) and `old_log_probs`
(recomputed by the actor before the update) must match up to floating-point noise (~1e-5 in fp32 on
CPU). A larger gap means the rollout sampled from other weights than the actor trains (a weight-sync
bug), or in another precision, and silently turns on-policy training off-policy.
"""

from __future__ import annotations

import torch


def rollout_logprob_diff_metrics(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Max and mean of |rollout_log_probs - old_log_probs| over the response tokens.

    All three tensors are (batch, response_len); only positions with response_mask == 1 count.
    """
    shapes = {t.shape for t in (rollout_log_probs, old_log_probs, response_mask)}
    if len(shapes) != 1:
        raise ValueError(
            "rollout_log_probs, old_log_probs and response_mask must share one (batch, response_len) "
            f"shape; got {tuple(rollout_log_probs.shape)}, {tuple(old_log_probs.shape)}, "
            f"{tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    if not bool(mask.any()):
        raise ValueError("response_mask has no 1s: there are no response tokens to compare")
    diff = (rollout_log_probs.float() - old_log_probs.float()).abs()[mask]  # (tokens,)
    return {
        "rollout/log_prob_diff_max": diff.max().item(),
        "rollout/log_prob_diff_mean": diff.mean().item(),
    }
