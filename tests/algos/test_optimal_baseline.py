"""The optimal token baseline: per-position baselines weighted by each response's path variance."""

import numpy as np
import pytest
import torch

from hybridrl.algos import (
    compute_grpo_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
    get_adv_estimator_fn,
    get_adv_estimator_spec,
)

PAIR = np.array(["p", "p"], dtype=object)


def inputs(pi, sum_pi_squared, rewards, mask):
    """old_log_probs / sum_pi_squared chosen so that each token's variance term 1 - 2 pi + sum pi^2 is known."""
    pi, sum_pi_squared = torch.tensor(pi), torch.tensor(sum_pi_squared)
    return dict(token_level_rewards=torch.tensor(rewards), response_mask=torch.tensor(mask),
                old_log_probs=pi.log(), sum_pi_squared=sum_pi_squared)


def test_equal_path_weights_give_the_group_mean_return_as_baseline():
    # every token: 1 - 2 (0.5) + 0.5 = 0.5; returns-to-go (1, 1) and (0, 0) -> baseline 0.5 everywhere
    x = inputs([[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]], [[0.0, 1.0], [0.0, 0.0]], [[1, 1], [1, 1]])
    advantages, returns = compute_optimal_token_baseline_advantage(index=PAIR, **x)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))


def test_a_confident_path_weighs_little_in_the_baseline():
    # response 0: pi = 0.9, sum pi^2 = 0.82 -> 0.02 per token; response 1: pi = 0.1, sum = 0.5 -> 1.3.
    # W = (0.02, 0.04) and (1.3, 2.6): B_t = (1 x W0_t) / (W0_t + W1_t) = 0.02 / 1.32 at both positions
    x = inputs([[0.9, 0.9], [0.1, 0.1]], [[0.82, 0.82], [0.5, 0.5]], [[0.0, 1.0], [0.0, 0.0]], [[1, 1], [1, 1]])
    advantages, _ = compute_optimal_token_baseline_advantage(index=PAIR, **x)
    baseline = 0.02 / 1.32
    torch.testing.assert_close(advantages, torch.tensor([[1 - baseline] * 2, [-baseline] * 2]))
    # rollout IS weights scale each path term by their square: 0.5^2 on response 1 -> B = 0.02 / (0.02 + 0.325)
    weights = torch.tensor([[1.0, 1.0], [0.5, 0.5]])
    advantages, _ = compute_optimal_token_baseline_advantage(index=PAIR, rollout_is_weights=weights, **x)
    torch.testing.assert_close(advantages[1], torch.full((2,), -0.02 / 0.345))


def test_the_longest_responses_lone_tail_keeps_its_return():
    # response 0 runs 3 tokens, response 1 only 1: past position 0 response 0 is alone, its baseline would be
    # its own return (advantage 0); handle_zero_tail sets it to 0 there
    x = inputs([[0.5] * 3, [0.5] * 3], [[0.5] * 3, [0.5] * 3], [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]],
               [[1, 1, 1], [1, 0, 0]])
    tail_zeroed, returns = compute_optimal_token_baseline_advantage(index=PAIR, **x)
    torch.testing.assert_close(tail_zeroed[0, 1:], returns[0, 1:])  # advantage = return-to-go = 1
    assert tail_zeroed[0, 0].item() == pytest.approx(0.5) and tail_zeroed[1, 0].item() == pytest.approx(-0.5)
    kept, _ = compute_optimal_token_baseline_advantage(index=PAIR, handle_zero_tail=False, **x)
    torch.testing.assert_close(kept[0, 1:], torch.zeros(2))
    assert torch.all(tail_zeroed[1, 1:] == 0)  # nothing on padding


def test_a_lone_response_has_no_baseline():
    x = inputs([[0.5, 0.5]], [[0.5, 0.5]], [[0.0, 2.0]], [[1, 1]])
    advantages, returns = compute_optimal_token_baseline_advantage(index=np.array(["q"], dtype=object), **x)
    torch.testing.assert_close(advantages, returns)


def test_multi_turn_variant_aligns_by_valid_tokens():
    # response 0 has a masked tool output at position 1; by valid token its 2nd token meets response 1's 2nd
    torch.manual_seed(0)
    pi = torch.rand(2, 3) * 0.8 + 0.1
    x = dict(token_level_rewards=torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]),
             old_log_probs=pi.log(), sum_pi_squared=torch.full((2, 3), 0.4))
    holed = torch.tensor([[1, 0, 1], [1, 1, 0]])
    compact = torch.tensor([[1, 1, 0], [1, 1, 0]])
    tir, _ = compute_multi_turn_optimal_token_baseline_advantage(index=PAIR, response_mask=holed, **x)
    # the same responses with the hole squeezed out, by position
    squeezed = dict(token_level_rewards=torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.5, 0.0]]),
                    old_log_probs=torch.stack([pi[0, [0, 2, 1]], pi[1]]).log(),
                    sum_pi_squared=x["sum_pi_squared"])
    by_position, _ = compute_optimal_token_baseline_advantage(index=PAIR, response_mask=compact, **squeezed)
    torch.testing.assert_close(tir[0, [0, 2]], by_position[0, :2])
    torch.testing.assert_close(tir[1], by_position[1])
    assert tir[0, 1] == 0
    # with contiguous masks both variants agree
    a, _ = compute_optimal_token_baseline_advantage(index=PAIR, response_mask=compact, **squeezed)
    b, _ = compute_multi_turn_optimal_token_baseline_advantage(index=PAIR, response_mask=compact, **squeezed)
    torch.testing.assert_close(a, b)


def test_registered_with_their_inputs_and_zero_mean_like_a_baseline_should():
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        spec = get_adv_estimator_spec(name)
        assert spec.required_inputs == ("index", "old_log_probs", "sum_pi_squared")
    assert get_adv_estimator_fn("optimal_token_baseline") is compute_optimal_token_baseline_advantage
    # with equal path weights and outcome rewards the first token's baseline is the group mean (GRPO's
    # baseline without the std)
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.3, 0.9])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    advantages, _ = compute_optimal_token_baseline_advantage(
        rewards, torch.ones(4, 3), index, torch.full((4, 3), 0.5).log(), torch.full((4, 3), 0.5))
    grpo, _ = compute_grpo_outcome_advantage(rewards, torch.ones(4, 3), index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(advantages, grpo)
