"""Advantage estimators, each registered by name (verl `core_algos` names and arguments).

Every estimator takes `token_level_rewards` (batch, response_len) -- for outcome rewards the sequence
score sits on the last valid token -- and `response_mask` (batch, response_len), and returns
`(advantages, returns)` of the same shape, zero where the mask is zero. Outcome estimators group the
responses of one prompt by `index` (one uid per response). Group conventions follow verl: a group of
one response gets baseline 0 (and std 1), so its advantage is its raw score and nothing is NaN.

Call them directly by their verl names, or uniformly through `compute_advantage(name, ...)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hybridrl.algos.adv_registry import AdvantageEstimator, register_adv_est
from hybridrl.algos.config_args import config_value
from hybridrl.algos.grouping import group_ids, group_mean_std, group_sum
from hybridrl.utils.torch_functional import masked_whiten

Index = np.ndarray | Sequence[Any] | torch.Tensor


def _float_mask(response_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return response_mask.to(dtype=like.dtype, device=like.device)


@register_adv_est(AdvantageEstimator.GAE, needs_critic=True)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, https://arxiv.org/abs/1506.02438).

    delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1},   R_t = A_t + V_t.
    Masked positions inside a response (e.g. tool output in multi-turn) are skipped: the next valid
    token's value and advantage are carried across them. Advantages are then whitened over all valid
    tokens of the batch (as verl and TRL do); returns are not.
    """
    mask = _float_mask(response_mask, values)
    batch, length = token_level_rewards.shape
    next_value = values.new_zeros(batch)  # (batch,) V_{t+1} of the next valid token
    last_adv = values.new_zeros(batch)  # (batch,) A_{t+1}
    advantages = torch.zeros_like(values)  # (batch, response_len)
    for t in reversed(range(length)):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * last_adv
        m = mask[:, t]
        next_value = values[:, t] * m + (1 - m) * next_value
        last_adv = adv_t * m + (1 - m) * last_adv
        advantages[:, t] = last_adv
    returns = (advantages + values) * mask
    advantages = masked_whiten(advantages, response_mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO group-relative advantage (Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300).

    A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon), with s_i = sum_t r_it and std the unbiased
    (n-1) standard deviation of the prompt's group g, broadcast to every valid token.
    `norm_adv_by_std_in_grpo=False` drops the division: Dr. GRPO (Liu et al. 2025,
    https://arxiv.org/abs/2503.20783), which removes the bias toward too-easy / too-hard prompts.
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0])
    _, mean, std = group_mean_std(scores, gid, n_groups)
    gid = gid.to(scores.device)
    adv = scores - mean[gid]
    if norm_adv_by_std_in_grpo:
        adv = adv / (std[gid] + epsilon)
    adv = adv.unsqueeze(-1) * _float_mask(response_mask, adv)  # (batch, response_len)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k-style group advantage (https://arxiv.org/abs/2503.19595), as in verl.

    Only the best response of each group is credited: A_best = r_max - r_second_max (divided by
    std_g + epsilon when `norm_adv_by_std_in_grpo`); every other response gets 0. It needs at least
    two responses per prompt, otherwise "second best" does not exist.
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0])
    gid = gid.to(scores.device)
    adv = torch.zeros_like(scores)  # (batch,)
    for g in range(n_groups):
        members = torch.nonzero(gid == g).squeeze(-1)
        if members.numel() < 2:
            raise ValueError(
                f"grpo_passk needs at least 2 responses per prompt, group {g} has {members.numel()}; "
                f"set actor_rollout_ref.rollout.n >= 2"
            )
        group_scores = scores[members]
        top2, top2_pos = torch.topk(group_scores, 2)
        gain = top2[0] - top2[1]
        if norm_adv_by_std_in_grpo:
            gain = gain / (torch.std(group_scores) + epsilon)
        adv[members[top2_pos[0]]] = gain
    adv = adv.unsqueeze(-1) * _float_mask(response_mask, adv)  # (batch, response_len)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740).

    A_i = s_i - (1/(n-1)) sum_{j != i} s_j = n/(n-1) * (s_i - mean_g(s)) for a group of n responses.
    A lone response has no peers, so its baseline is 0 and A_i = s_i. `epsilon` is unused; it is
    accepted so verl call sites work unchanged.
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0])
    count, mean, _ = group_mean_std(scores, gid, n_groups)
    gid = gid.to(scores.device)
    n = count[gid]  # (batch,)
    loo = (scores - mean[gid]) * n / (n - 1).clamp(min=1)
    adv = torch.where(n > 1, loo, scores)
    adv = adv.unsqueeze(-1) * _float_mask(response_mask, adv)  # (batch, response_len)
    return adv, adv


@register_adv_est(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, https://arxiv.org/abs/2505.23585).

    The baseline is the length-weighted group mean b_g = sum_j |y_j| s_j / sum_j |y_j|, the
    variance-minimising baseline when the gradient norm grows with length; A_i = s_i - b_g.
    A lone response gets baseline 0. `epsilon` is unused (kept for verl call sites).
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0])
    gid = gid.to(scores.device)
    count = group_sum(torch.ones_like(scores), gid, n_groups)
    weighted = group_sum(lengths * scores, gid, n_groups)
    total_len = group_sum(lengths, gid, n_groups)
    baseline = weighted / total_len.clamp(min=1e-8)  # (n_groups,); all-empty group -> 0
    baseline = torch.where(count > 1, baseline, torch.zeros_like(baseline))
    adv = scores - baseline[gid]
    adv = adv.unsqueeze(-1) * _float_mask(response_mask, adv)  # (batch, response_len)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    *,
    gamma: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262).

    Discounted return-to-go over the response's valid tokens, G_t = r_t + gamma * G_next, where
    G_next is the return of the next valid token: masked positions inside a response (tool output in
    a multi-turn rollout) are skipped, neither discounted nor adding their reward, and hold 0. The
    returns are then whitened over all valid tokens of the batch (global normalisation instead of a
    critic): A_t = (G_t - mean(G)) / sqrt(var(G) + 1e-8).
    `gamma` comes as a keyword or, as verl passes it, from `config.gamma`.
    """
    gamma = config_value(config, "gamma", gamma, "reinforce_plus_plus")
    mask = _float_mask(response_mask, token_level_rewards)
    returns = torch.zeros_like(token_level_rewards)  # (batch, response_len)
    running = token_level_rewards.new_zeros(token_level_rewards.shape[0])  # (batch,) G of the next valid token
    for t in reversed(range(token_level_rewards.shape[1])):
        m = mask[:, t]
        candidate = token_level_rewards[:, t] + gamma * running
        returns[:, t] = candidate * m
        running = candidate * m + running * (1 - m)  # a masked token passes the later return through
    advantages = masked_whiten(returns, response_mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (https://arxiv.org/abs/2501.03262).

    Subtract the prompt group's mean score (0 for a lone response), broadcast to every valid token,
    then whiten over all valid tokens of the batch. `epsilon` is unused (kept for verl call sites).
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0])
    _, mean, _ = group_mean_std(scores, gid, n_groups)
    centred = scores - mean[gid.to(scores.device)]
    mask = _float_mask(response_mask, scores)
    adv = centred.unsqueeze(-1) * mask  # (batch, response_len)
    adv = masked_whiten(adv, response_mask) * mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, https://arxiv.org/abs/2310.10505).

    G_t = sum_{t' >= t} r_t' (undiscounted return-to-go) and A_t = G_t - b, where b is the reward of
    the greedy response to the same prompt (`reward_baselines`, shape (batch,)).
    """
    mask = _float_mask(response_mask, token_level_rewards)
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])  # (batch, len)
    advantages = returns - reward_baselines.to(returns.dtype).unsqueeze(-1) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient (Chu et al. 2025, https://arxiv.org/abs/2504.02546).

    A_i = alpha * (s_i - mean_g(s)) / f_norm with alpha = B / M, B the batch size and M the number of
    responses with a non-zero score (verl's reading of the paper's valid-sample correction), so the
    gradient is not diluted by samples that carry no signal. `epsilon` is unused (verl call sites).
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    batch = scores.shape[0]
    alpha = batch / max(int(torch.count_nonzero(scores)), 1)
    gid, n_groups = group_ids(index, batch)
    _, mean, _ = group_mean_std(scores, gid, n_groups)
    adv = alpha * (scores - mean[gid.to(scores.device)]) / f_norm
    adv = adv.unsqueeze(-1) * _float_mask(response_mask, adv)  # (batch, response_len)
    return adv, adv


# hybridrl's GRPO and RLOO are vectorised already (scatter-adds over group ids instead of a Python
# loop over groups), so verl's vectorised variants are the same functions under their names.
compute_grpo_vectorized_outcome_advantage = register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)(
    compute_grpo_outcome_advantage
)
compute_rloo_vectorized_outcome_advantage = register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)(
    compute_rloo_outcome_advantage
)
