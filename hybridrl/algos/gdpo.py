"""GDPO, Group reward-Decoupled normalization Policy Optimization (https://arxiv.org/abs/2601.05242).

GRPO normalises a sum of reward parts, where a part with a large spread drowns the others; GDPO
normalises each part k within the prompt's group, then sums them with weights and whitens over the batch:

    A^k_i = (r^k_i - mean_g(r^k)) / (std_g(r^k) + eps),     A_it = whiten_batch(sum_k w_k A^k_i)

The parts are the reward function's extra outputs named by `algorithm.gdpo_reward_keys` (weights:
`algorithm.gdpo_reward_weights`, 1 by default), read from non_tensor_batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hybridrl.algos.adv_registry import AdvantageEstimator, register_adv_est
from hybridrl.algos.advantage import Index, compute_grpo_outcome_advantage
from hybridrl.utils.torch_functional import masked_whiten
from hybridrl.utils.typed_config import require_config_object


class GDPOInputError(ValueError, AssertionError):
    """A GDPO input is missing or inconsistent: a ValueError, and the AssertionError verl raises."""


def _component_scores(non_tensor_batch: Mapping[str, Any] | None, key: str, rows: int,
                      device: torch.device) -> torch.Tensor:
    """One reward component as a float tensor (rows,), with an error naming what is wrong."""
    if non_tensor_batch is None or key not in non_tensor_batch:
        available = sorted(non_tensor_batch) if non_tensor_batch is not None else []
        raise GDPOInputError(
            f"GDPO reward key {key!r} (algorithm.gdpo_reward_keys) is not among the batch's reward outputs "
            f"{available}: the reward function must return a dict holding {key!r} for every row")
    values = list(non_tensor_batch[key])
    if len(values) != rows:
        raise GDPOInputError(f"GDPO reward key {key!r} has {len(values)} values for {rows} rows")
    for row, value in enumerate(values):
        if value is None or isinstance(value, str | bytes):
            raise GDPOInputError(f"GDPO reward key {key!r}: row {row} holds {value!r}, not a number; the reward "
                                 f"function must return {key!r} for every row")
    return torch.as_tensor(np.asarray(values, dtype=np.float32), device=device)


@register_adv_est(AdvantageEstimator.GDPO)
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO advantages, returned twice (advantages, returns), (batch, response_len) each.

    The keys and weights are the algorithm `config`'s gdpo_reward_keys / gdpo_reward_weights, and a config
    needs the keys (verl's call); without a config the whole score is the one part, as in verl. `batch` is
    accepted for verl's call.
    """
    rows = token_level_rewards.shape[0]
    keys = weights = None
    if config is not None:
        require_config_object(config, "gdpo", "the algorithm config (algorithm.gdpo_reward_keys, ...)")
        keys, weights = config.gdpo_reward_keys, config.gdpo_reward_weights
    if config is not None and not keys:
        raise GDPOInputError("GDPO requires algorithm.gdpo_reward_keys: the reward components (extra keys the "
                             "reward function returns, e.g. ['format_reward', 'accuracy_reward']) it normalises")
    if keys:
        components = [_component_scores(non_tensor_batch, key, rows, token_level_rewards.device) for key in keys]
    else:
        components = [token_level_rewards.sum(dim=-1)]
    if weights is None:
        weights = [1.0] * len(components)
    weights = list(weights)
    if len(weights) != len(components):
        raise GDPOInputError(f"algorithm.gdpo_reward_weights has {len(weights)} weight(s) for {len(components)} "
                             f"reward key(s) {list(keys or [])}: give one weight per key, in the same order")
    combined = torch.zeros(rows, dtype=torch.float32, device=token_level_rewards.device)
    one_token = torch.ones(rows, 1, device=token_level_rewards.device)
    for weight, scores in zip(weights, components, strict=True):
        normalised, _ = compute_grpo_outcome_advantage(scores.float().unsqueeze(-1), one_token, index, epsilon,
                                                       norm_adv_by_std_in_grpo)
        combined = combined + float(weight) * normalised.squeeze(-1)
    mask = response_mask.to(combined.dtype)
    advantages = masked_whiten(combined.unsqueeze(-1) * mask, response_mask) * mask  # (batch, response_len)
    return advantages, advantages
