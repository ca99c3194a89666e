"""The critic's clipped value loss, aggregated with `agg_loss`."""

from __future__ import annotations

import torch

from hybridrl.algos.aggregate import agg_loss
from hybridrl.utils.torch_functional import clip_by_value, masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: float | torch.Tensor | None = None,
    global_batch_size: float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped value loss (Schulman et al. 2017, https://arxiv.org/abs/1707.06347; as OpenAI baselines).

    V_clip = values + clip(vpreds - values, -c, c);  L = 0.5 * agg(max((vpreds - R)^2, (V_clip - R)^2)).
    vpreds, returns, values (rollout-time predictions): (batch, response_len). dp_size, batch_num_tokens,
    global_batch_size and loss_scale_factor are the mini-batch totals `agg_loss` normalises by (verl's call).
    Returns vf_loss and vf_clipfrac, the share of valid tokens where the clipped term was larger.
    """
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value (critic.cliprange_value) must be >= 0, got {cliprange_value}")
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.max(loss_unclipped, loss_clipped), response_mask, loss_agg_mode, dp_size=dp_size,
                             batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                             loss_scale_factor=loss_scale_factor)
    with torch.no_grad():
        vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac

