"""Advantage estimators, registered under verl's `core_algos` names and arguments, and PF-PPO's resampling.

Each takes `token_level_rewards` (batch, response_len; an outcome score sits on the last valid token)
and `response_mask`, and returns `(advantages, returns)` of that shape, zero where the mask is. Outcome
estimators group a prompt's responses by `index` (one uid per response) with scatter-adds; as in verl,
a group of one response gets baseline 0 and std 1, so its advantage is its raw score. An `epsilon` that
an estimator does not use is accepted for verl's call sites.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hybridrl.algos.adv_registry import AdvantageEstimator, register_adv_est
from hybridrl.protocol import DataProto
from hybridrl.utils.torch_functional import masked_whiten
from hybridrl.utils.typed_config import require_config_object

PF_PPO_METHODS = ("pow", "max_min", "max_random")
Index = np.ndarray | Sequence[Any] | torch.Tensor


@torch.no_grad()
def group_ids(index: Index, batch_size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, int]:
    """(gid, n_groups): each sample's dense group id (batch,) on `device`, in order of first appearance of its uid."""
    keys = index.tolist() if isinstance(index, torch.Tensor) else np.asarray(index, dtype=object).ravel().tolist()
    if len(keys) != batch_size:
        raise ValueError(
            f"index has {len(keys)} entries but the batch has {batch_size} responses; pass one prompt uid "
            f"per response (non_tensor_batch['uid'] after repeating the batch rollout.n times)"
        )
    dense: dict[Any, int] = {}
    gid = [dense.setdefault(key, len(dense)) for key in keys]
    return torch.tensor(gid, dtype=torch.long, device=device), len(dense)


def group_sum(values: torch.Tensor, gid: torch.Tensor, n_groups: int) -> torch.Tensor:
    """sum of `values` (batch,) within each group -> (n_groups,)."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, gid, values)


def group_stats(
    token_level_rewards: torch.Tensor, index: Index
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each response's score s_i = sum_t r_it and its group's size, mean and unbiased std, (batch,) each; a
    lone response gets mean 0 and std 1."""
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0], scores.device)
    count = group_sum(torch.ones_like(scores), gid, n_groups)  # (n_groups,)
    mean = group_sum(scores, gid, n_groups) / count
    centred_sq = (scores - mean[gid]) ** 2  # (batch,)
    std = torch.sqrt(group_sum(centred_sq, gid, n_groups) / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return scores, count[gid], mean[gid], std[gid]


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
    Masked positions inside a response (tool output) are skipped, carrying the next valid token's value
    and advantage across them. Advantages are whitened over the batch's valid tokens; returns are not.
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

    A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon), s_i = sum_t r_it, std unbiased over the prompt's group g.
    `norm_adv_by_std_in_grpo=False` drops the division: Dr. GRPO (https://arxiv.org/abs/2503.20783).
    """
    scores, _, mean, std = group_stats(token_level_rewards, index)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
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

    Only each group's best response is credited: A_best = r_max - r_second_max (divided by std_g + epsilon
    when `norm_adv_by_std_in_grpo`), 0 for the others. Raises for a group of fewer than two responses.
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0], scores.device)
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

    A_i = s_i - (1/(n-1)) sum_{j != i} s_j = n/(n-1) * (s_i - mean_g(s)); a lone response gets A_i = s_i.
    """
    scores, n, mean, _ = group_stats(token_level_rewards, index)
    loo = (scores - mean) * n / (n - 1).clamp(min=1)
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

    A_i = s_i - b_g with the length-weighted group mean b_g = sum_j |y_j| s_j / sum_j |y_j|, the
    variance-minimising baseline when the gradient norm grows with length; a lone response gets b = 0.
    """
    scores = token_level_rewards.sum(dim=-1)  # (batch,)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)  # (batch,)
    gid, n_groups = group_ids(index, scores.shape[0], scores.device)
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
    config: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262).

    G_t = r_t + gamma * G_next over the valid tokens (masked tool output is skipped and holds 0), then
    whitened over the batch's valid tokens instead of a critic: A_t = (G_t - mean(G)) / sqrt(var(G) + 1e-8).
    gamma is `config.gamma`, the algorithm config's (verl's call).
    """
    require_config_object(config, "reinforce_plus_plus", "the algorithm config (its gamma: algorithm.gamma)")
    gamma = config.gamma
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

    A = s_i - mean_g(s) (0 baseline for a lone response) on every valid token, whitened over the batch.
    """
    scores, _, mean, _ = group_stats(token_level_rewards, index)
    mask = _float_mask(response_mask, scores)
    adv = (scores - mean).unsqueeze(-1) * mask  # (batch, response_len)
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

    A_i = alpha * (s_i - mean_g(s)) / f_norm, alpha = B / M with B the batch size and M the responses with
    a non-zero score (verl's reading of the paper's valid-sample correction).
    """
    scores, _, mean, _ = group_stats(token_level_rewards, index)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    adv = alpha * (scores - mean) / f_norm
    adv = adv.unsqueeze(-1) * _float_mask(response_mask, adv)  # (batch, response_len)
    return adv, adv


# GRPO and RLOO are vectorised already, so verl's vectorised variants are the same functions.
compute_grpo_vectorized_outcome_advantage = register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)(
    compute_grpo_outcome_advantage
)
compute_rloo_vectorized_outcome_advantage = register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)(
    compute_rloo_outcome_advantage
)


def pf_ppo_weights(scores: torch.Tensor, reweight_method: str = "pow", weight_pow: float = 2.0) -> torch.Tensor:
    """PF-PPO's sampling weights (batch,) for sequence scores (batch,), before the 1e-8 each one gets.

    Policy Filtration for PPO (Zhang et al. 2024, https://arxiv.org/abs/2409.06957) redraws the batch
    toward the reward's extremes: pow: |s|^weight_pow; max_min: 1 for the highest and lowest score, else
    0; max_random: 0.4 for the highest, else 0.1.
    """
    if reweight_method == "pow":
        return scores.abs().pow(weight_pow)
    if reweight_method == "max_min":
        return ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    if reweight_method == "max_random":
        return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    raise ValueError(f"algorithm.pf_ppo.reweight_method must be one of {PF_PPO_METHODS}, got {reweight_method!r}")


@torch.no_grad()
def compute_pf_ppo_reweight_data(data: DataProto, reweight_method: str = "pow", weight_pow: float = 2.0,
                                 generator: torch.Generator | None = None) -> DataProto:
    """The batch redrawn with replacement by `pf_ppo_weights` (verl's name); a CPU `generator` fixes the draw."""
    if "token_level_scores" not in data.batch:
        raise KeyError("PF-PPO resamples by the batch column 'token_level_scores' (the reward), which is missing")
    scores = data.batch["token_level_scores"].sum(dim=-1).float().cpu()  # (batch,)
    weights = pf_ppo_weights(scores, reweight_method, weight_pow) + 1e-8
    rows = torch.multinomial(weights, len(data), replacement=True, generator=generator)
    return data.select_rows(rows)


# Optimal Token Baseline (OTB; verl's `optimal_token_baseline`, derivation:
# https://yingru.notion.site/The-Optimal-Token-Baseline-399211a558b782cfa936014c0d42dfb8): a group's
# per-position baseline weighting each response by its score function's squared norm up to t. For a
# softmax policy one step's norm is 1 - 2 pi(y_j) + sum_v pi_v^2, so with W_t = sum_{j<=t} of that
# (times rho_t^2 with rollout IS weights):
#     B_t = sum_i G_it W_it / sum_i W_it (responses valid at t),   A_it = G_it - B_t,   G_it = sum_{s>=t} r_is
# A lone response gets B = 0; `handle_zero_tail` zeroes B where the group's longest response runs on alone
# (it would be its own return). pi comes from old_log_probs, sum_v pi_v^2 from the old log-prob pass.
def _otb(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Index, old_log_probs: torch.Tensor,
         sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None, handle_zero_tail: bool,
         epsilon: float, by_valid_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, length = token_level_rewards.shape
    mask = response_mask.to(torch.float32)
    valid = mask > 0
    returns = (token_level_rewards.float() * mask).flip(-1).cumsum(-1).flip(-1)  # (rows, length) G_t
    step_weight = 1 - 2 * torch.exp(old_log_probs.float()) + sum_pi_squared.float()
    if rollout_is_weights is not None:
        step_weight = step_weight * rollout_is_weights.float().square()
    path_weight = (step_weight * mask).cumsum(-1)  # (rows, length) W_t
    lengths = mask.sum(-1).long()  # (rows,)
    if by_valid_token:  # the n-th valid token of every response shares slot n
        slot = (mask.cumsum(-1) - 1).clamp(min=0).long()
        member = lengths > 0
    else:
        slot = torch.arange(length, device=mask.device).expand(rows, length)
        member = torch.ones(rows, dtype=torch.bool, device=mask.device)
    gid, n_groups = group_ids(index, rows, mask.device)
    cell = gid.unsqueeze(-1) * length + slot  # (rows, length) (group, slot) as one flat index
    numerator = group_sum((returns * path_weight)[valid], cell[valid], n_groups * length)
    denominator = group_sum(path_weight[valid], cell[valid], n_groups * length)
    baseline = numerator[cell] / (denominator[cell] + epsilon)  # (rows, length)
    group_size = group_sum(member.float(), gid, n_groups)
    baseline = baseline * ((group_size[gid] >= 2) & member).unsqueeze(-1)
    if handle_zero_tail:
        for group in range(n_groups):
            rows_in_group = torch.nonzero((gid == group) & member).squeeze(-1)
            if rows_in_group.numel() < 2:
                continue
            group_lengths = lengths[rows_in_group]
            top2 = torch.topk(group_lengths, 2).values
            if top2[0] > top2[1]:  # one response is longest, alone past the second-longest's end
                longest = rows_in_group[torch.argmax(group_lengths)]
                baseline[longest] = torch.where(slot[longest] >= top2[1], 0.0, baseline[longest])
    advantages = (returns - baseline) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB advantages and returns-to-go, (batch, response_len) each, tokens aligned by position (`_otb`)."""
    return _otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights,
                handle_zero_tail, epsilon, by_valid_token=False)


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for tool-interleaved responses: tokens aligned by their count of valid tokens so far, so masked
    tool output does not shift them; responses without valid tokens are left out of their group."""
    return _otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights,
                handle_zero_tail, epsilon, by_valid_token=True)


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
    """GDPO, Group reward-Decoupled normalization Policy Optimization (https://arxiv.org/abs/2601.05242).

    Each reward part k is normalised within the prompt's group, then the parts are summed with weights and
    whitened over the batch, so a part with a large spread does not drown the others:
    A^k_i = (r^k_i - mean_g(r^k)) / (std_g(r^k) + eps),   A_it = whiten_batch(sum_k w_k A^k_i).
    Returned twice (advantages, returns), (batch, response_len) each.

    The parts are the reward function's extra outputs (non_tensor_batch); their keys and weights are the
    algorithm `config`'s gdpo_reward_keys / gdpo_reward_weights, and a config needs the keys (verl's call);
    without a config the whole score is the one part, as in verl. `batch` is accepted for verl's call.
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
    weights = [1.0] * len(components) if weights is None else list(weights)
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
