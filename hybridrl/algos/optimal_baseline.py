"""The Optimal Token Baseline (OTB): a per-token baseline that minimises the policy gradient's variance.

A group of responses to one prompt shares a baseline for each token position t instead of one per
response. The variance-minimising baseline for the return-to-go G_t weighs each response by the squared
norm of its score function up to t. For a softmax policy the norm of d log pi(y_j) / d logits at one
step is ||e_{y_j} - pi||^2 = 1 - 2 pi(y_j) + sum_v pi_v^2, so with W_t = sum_{j<=t} (1 - 2 pi_j + sum pi^2)

    B_t = sum_i G_it W_it / sum_i W_it       (over the group's responses valid at t)
    A_it = G_it - B_t                         (G_it = sum_{s>=t} r_is, the reward-to-go)

(verl's `optimal_token_baseline`; derivation: https://yingru.notion.site/The-Optimal-Token-Baseline-
399211a558b782cfa936014c0d42dfb8). With rollout importance weights rho the path weights become
rho_t^2 W_t. A group of one response has baseline 0. `handle_zero_tail`: where the longest response of
a group runs on alone past every other one, its baseline there would be its own return (advantage 0);
it is set to 0 instead, so those tokens keep their return as advantage.

pi_j is the old policy's probability of the sampled token (exp(old_log_probs)); sum_v pi_v^2 comes from
the actor's old log-prob pass with `actor_rollout_ref.actor.calculate_sum_pi_squared=true`.
`tir_optimal_token_baseline` aligns the responses by their n-th valid token instead of by position, for
multi-turn responses whose tool outputs are masked out of the middle of the response.
"""

from __future__ import annotations

import torch

from hybridrl.algos.adv_registry import AdvantageEstimator, register_adv_est
from hybridrl.algos.advantage import Index
from hybridrl.algos.grouping import group_ids


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
    gid, n_groups = group_ids(index, rows)
    gid = gid.to(mask.device)
    cell = gid.unsqueeze(-1) * length + slot  # (rows, length) (group, slot) as one flat index
    numerator = torch.zeros(n_groups * length, device=mask.device)
    denominator = torch.zeros(n_groups * length, device=mask.device)
    numerator.index_add_(0, cell[valid], (returns * path_weight)[valid])
    denominator.index_add_(0, cell[valid], path_weight[valid])
    baseline = numerator[cell] / (denominator[cell] + epsilon)  # (rows, length)
    group_size = torch.zeros(n_groups, device=mask.device).index_add_(0, gid, member.float())
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
    """OTB advantages and returns-to-go, (batch, response_len) each (module docstring); token positions
    of a group's responses are aligned by their index in the response."""
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
    """OTB for tool-interleaved responses: as `compute_optimal_token_baseline_advantage`, with the tokens
    of a group's responses aligned by their count of valid tokens so far (masked tool output in between
    does not shift them); responses without valid tokens are left out of their group."""
    return _otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights,
                handle_zero_tail, epsilon, by_valid_token=True)
