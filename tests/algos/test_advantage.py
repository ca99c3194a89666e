"""Advantage estimators against hand-worked values, the papers' invariants and loop references."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridrl.algos import (
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from hybridrl.utils.torch_functional import masked_whiten


def outcome_batch(scores, lengths, width=4):
    """Rewards with each score on the last valid token, and right-padded masks."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width, dtype=torch.long)
    for i, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :length] = 1
        if length:
            rewards[i, length - 1] = score
    return rewards, mask


def per_sequence(adv, mask):
    """The single value an outcome estimator broadcasts over a sequence's valid tokens."""
    values = []
    for row, m in zip(adv, mask, strict=True):
        valid = row[m.bool()]
        assert torch.allclose(valid, valid[:1].expand_as(valid)), (
            "outcome advantage must be constant per sequence"
        )
        assert torch.all(row[~m.bool()] == 0), "advantage must be 0 on masked tokens"
        values.append(valid[0].item() if valid.numel() else 0.0)
    return values


# ---------------------------------------------------------------- GRPO


def test_grpo_hand_values_with_singleton_group():
    rewards, mask = outcome_batch([1, 0, 2, 4, 6, 3], [2, 3, 1, 4, 2, 3])
    index = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index)
    # a: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.7071 -> +-0.5 / 0.7071 = +-0.7071
    # b: mean 4, std sqrt((4 + 0 + 4) / 2) = 2 -> -1, 0, 1
    # c: single response -> mean 0, std 1 -> 3 / (1 + 1e-6)
    expected = [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), -1.0, 0.0, 1.0, 3.0]
    assert per_sequence(adv, mask) == pytest.approx(expected, abs=1e-5)
    assert torch.equal(adv, ret)


def test_dr_grpo_drops_the_std_division():
    rewards, mask = outcome_batch([1, 0, 2, 4, 6, 3], [2, 3, 1, 4, 2, 3])
    index = ["a", "a", "b", "b", "b", "c"]
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert per_sequence(adv, mask) == pytest.approx([0.5, -0.5, -2.0, 0.0, 2.0, 3.0])


def test_grpo_is_zero_mean_unit_std_within_each_group():
    torch.manual_seed(0)
    n_groups, n = 5, 6
    scores = torch.randn(n_groups * n).tolist()
    rewards, mask = outcome_batch(scores, [3] * len(scores))
    index = np.repeat(np.arange(n_groups), n)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    per_seq = torch.tensor(per_sequence(adv, mask)).view(n_groups, n)
    torch.testing.assert_close(per_seq.mean(dim=1), torch.zeros(n_groups), atol=1e-5, rtol=0)
    torch.testing.assert_close(per_seq.std(dim=1), torch.ones(n_groups), atol=1e-4, rtol=0)


def grpo_loop_reference(scores, index, eps=1e-6):
    out = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(scores)) if index[j] == index[i]]
        if len(group) == 1:
            out.append(s / (1 + eps))
            continue
        mean = sum(group) / len(group)
        std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1))
        out.append((s - mean) / (std + eps))
    return out


def test_grpo_vectorised_equals_simple_loop_on_random_ragged_batch():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 3, size=40).astype(float).tolist()
    lengths = rng.integers(1, 6, size=40).tolist()
    index = rng.integers(0, 9, size=40)  # uneven groups, some of size 1
    rewards, mask = outcome_batch(scores, lengths, width=6)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert per_sequence(adv, mask) == pytest.approx(grpo_loop_reference(scores, index), abs=1e-4)


def test_grpo_accepts_tensor_index_and_rejects_wrong_length():
    rewards, mask = outcome_batch([1, 0], [2, 2])
    adv_np, _ = compute_grpo_outcome_advantage(rewards, mask, np.array([7, 7]))
    adv_t, _ = compute_grpo_outcome_advantage(rewards, mask, torch.tensor([7, 7]))
    torch.testing.assert_close(adv_np, adv_t)
    with pytest.raises(ValueError, match="uid"):
        compute_grpo_outcome_advantage(rewards, mask, np.array([7, 7, 7]))


def test_identical_scores_and_empty_rows_give_finite_zero_advantages():
    rewards, mask = outcome_batch([1, 1, 0, 5], [2, 2, 0, 3])
    index = ["a", "a", "b", "c"]  # row 2 is fully masked and alone in its group
    for fn in (
        compute_grpo_outcome_advantage,
        compute_rloo_outcome_advantage,
        compute_opo_outcome_advantage,
        compute_gpg_outcome_advantage,
        compute_reinforce_plus_plus_baseline_outcome_advantage,
    ):
        adv, ret = fn(rewards, mask, index)
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), fn.__name__
        assert torch.all(adv[2] == 0), fn.__name__
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert per_sequence(adv, mask)[:2] == [0.0, 0.0]  # no variance in group a: nothing to learn


# ---------------------------------------------------------------- RLOO, OPO, GPG, pass@k


def test_rloo_hand_values_and_leave_one_out_baseline():
    rewards, mask = outcome_batch([1, 2, 6, 5], [1, 2, 3, 2])
    index = ["a", "a", "a", "b"]
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    # 1 - (2 + 6) / 2 = -3;  2 - (1 + 6) / 2 = -1.5;  6 - (1 + 2) / 2 = 4.5;  lone response keeps 5
    assert per_sequence(adv, mask) == pytest.approx([-3.0, -1.5, 4.5, 5.0])


def test_rloo_baseline_excludes_the_sample_itself():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=24).tolist()
    index = np.repeat(np.arange(6), 4)
    rewards, mask = outcome_batch(scores, [2] * 24)
    got = per_sequence(compute_rloo_outcome_advantage(rewards, mask, index)[0], mask)
    for i in range(24):
        others = [scores[j] for j in range(24) if index[j] == index[i] and j != i]
        assert got[i] == pytest.approx(scores[i] - sum(others) / len(others), abs=1e-5)


def test_opo_length_weighted_baseline():
    rewards, mask = outcome_batch([1, 0, 4], [1, 3, 2])
    adv, _ = compute_opo_outcome_advantage(rewards, mask, ["a", "a", "b"])
    # b_a = (1 * 1 + 3 * 0) / (1 + 3) = 0.25 -> 0.75, -0.25; lone response keeps 4
    assert per_sequence(adv, mask) == pytest.approx([0.75, -0.25, 4.0])


def test_gpg_scales_by_batch_over_nonzero_count():
    rewards, mask = outcome_batch([1, 0, 1, 1], [2, 2, 2, 2])
    index = ["a", "a", "b", "b"]
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, index)
    # alpha = 4 / 3 nonzero scores; a: mean 0.5 -> +-0.5 * 4/3; b: mean 1 -> 0
    assert per_sequence(adv, mask) == pytest.approx([2 / 3, -2 / 3, 0.0, 0.0])
    adv_f, _ = compute_gpg_outcome_advantage(rewards, mask, index, f_norm=2.0)
    torch.testing.assert_close(adv_f, adv / 2)


def test_grpo_passk_credits_only_the_best_response():
    rewards, mask = outcome_batch([0.2, 0.9, 0.5, 1.0, 1.0], [1, 2, 3, 1, 1])
    index = ["a", "a", "a", "b", "b"]
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    # a: best 0.9, second 0.5 -> 0.4 for the best only; b: tie -> 0.0 for both
    assert per_sequence(adv, mask) == pytest.approx([0.0, 0.4, 0.0, 0.0, 0.0])
    adv_n, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    # unbiased std of [0.2, 0.9, 0.5] = sqrt((0.1111 + 0.1344 + 0.0011) / 2) = 0.35119
    assert per_sequence(adv_n, mask)[1] == pytest.approx(0.4 / (0.351188 + 1e-6), abs=1e-4)


def test_grpo_passk_rejects_single_response_groups():
    rewards, mask = outcome_batch([1, 0, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="rollout.n"):
        compute_grpo_passk_outcome_advantage(rewards, mask, ["a", "a", "b"])


# ---------------------------------------------------------------- token-level estimators


def test_gae_hand_values():
    rewards = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    values = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.5)
    # row 0: t=1: delta = 1 + 0 - 2 = -1 -> A1 = -1
    #        t=0: delta = 0 + 0.9 * 2 - 1 = 0.8 -> A0 = 0.8 + 0.9 * 0.5 * (-1) = 0.35
    # row 1: t=1: delta = 0 -> A1 = 0;  t=0: delta = 1 + 0 - 0 = 1 -> A0 = 1
    raw = torch.tensor([[0.35, -1.0], [1.0, 0.0]])
    torch.testing.assert_close(ret, raw + values)
    torch.testing.assert_close(adv, masked_whiten(raw, mask))


def test_gae_with_gamma_lam_one_is_return_minus_value():
    torch.manual_seed(3)
    rewards = torch.randn(3, 5)
    values = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    adv, ret = compute_gae_advantage_return(rewards * mask, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(ret, reward_to_go * mask)
    torch.testing.assert_close(adv, masked_whiten(reward_to_go - values, mask) * mask)


def test_gae_skips_masked_tokens_inside_a_response():
    # the masked middle token (e.g. tool output) contributes neither its value 9 nor its reward 5
    rewards = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 0.0]])
    values = torch.tensor([[0.2, 9.0, 0.5], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    _, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # t=2: A = 1 - 0.5 = 0.5;  t=0: delta = 0 + 0.5 - 0.2 = 0.3, A = 0.3 + 0.5 = 0.8 -> R = 1.0
    torch.testing.assert_close(ret[0], torch.tensor([1.0, 0.0, 1.0]))


def test_reinforce_plus_plus_discounts_and_whitens():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the 7 sits in padding and must be ignored
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, SimpleNamespace(gamma=0.5))
    # row 0: 1, 0.5 * 1, 0.25;  row 1: G1 = 2, G0 = 0.5 * 2 = 1
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    valid = torch.tensor([0.25, 0.5, 1.0, 1.0, 2.0])  # mean 0.95
    expected = (valid - 0.95) / torch.sqrt(valid.var() + 1e-8)
    torch.testing.assert_close(adv[mask.bool()], expected)
    assert torch.all(adv[~mask.bool()] == 0)


def test_reinforce_plus_plus_carries_the_return_across_a_masked_span():
    # tokens 2 and 3 are tool output (mask 0): skipped, not discounted, and their reward 5 is not added
    rewards = torch.tensor([[0.0, 0.0, 5.0, 0.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]])
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, SimpleNamespace(gamma=0.5))
    # valid tokens from the end: G5 = 2, G4 = 0.5 * 2 = 1, G1 = 0.5 * 1 = 0.5, G0 = 0.25; the span holds 0
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0, 2.0]]))


def test_reinforce_plus_plus_reads_gamma_from_the_config_and_refuses_anything_else_there():
    rewards = torch.tensor([[0.0, 4.0]])
    mask = torch.ones(1, 2)
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=SimpleNamespace(gamma=0.25))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 4.0]]))  # 0.25 * 4 = 1
    for config in (None, 0.9):  # 0.9: the old positional gamma
        with pytest.raises(TypeError, match=r"the algorithm config \(its gamma: algorithm.gamma\); got"):
            compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config)


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens():
    rewards, mask = outcome_batch([1, 3, 2], [2, 1, 2])
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["a", "a", "b"])
    # centred: a -> -1, +1; lone b -> 2. Token values [-1, -1, 1, 2, 2], mean 0.6
    tokens = torch.tensor([-1.0, -1.0, 1.0, 2.0, 2.0])
    expected = (tokens - 0.6) / torch.sqrt(tokens.var() + 1e-8)
    torch.testing.assert_close(adv[mask.bool()], expected)


def test_remax_subtracts_greedy_baseline_from_return_to_go():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_remax_outcome_advantage(rewards, torch.tensor([0.4, 3.0]), mask)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    # 1 - 0.4 = 0.6 on every token; 2 - 3 = -1 on valid tokens, 0 on padding
    torch.testing.assert_close(adv, torch.tensor([[0.6, 0.6, 0.6], [-1.0, -1.0, 0.0]]))
