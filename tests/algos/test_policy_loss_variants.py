"""The policy losses of hybridrl/algos/policy_loss_variants.py, against values and gradients worked by hand
from each paper's objective."""

import math

import pytest
import torch
from test_policy_loss import actor

from hybridrl.algos import (
    compute_policy_loss_cispo,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_geo_mean,
    compute_policy_loss_importance_sampling,
    compute_policy_loss_sapo,
    compute_policy_loss_topr,
    compute_policy_loss_up,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)

TOKEN_MEAN = ["importance_sampling", "up", "cispo", "dppo_tv", "dppo_kl"]
SEQUENCE_MEAN = ["sapo", "geo_mean", "topr"]


def tokens(old_probs, new_probs, advantages):
    """(old_log_prob, log_prob with grad, advantages, mask) for one row of tokens given as probabilities."""
    old = torch.tensor([old_probs]).log()
    new = torch.tensor([new_probs]).log().requires_grad_(True)
    return old, new, torch.tensor([advantages]), torch.ones(1, len(old_probs))


def grad_of(loss, log_prob):
    return torch.autograd.grad(loss, log_prob)[0]


def on_policy_batch():
    torch.manual_seed(3)
    old = -torch.rand(3, 5) - 0.2
    log_prob = old.clone().requires_grad_(True)
    advantages = torch.tensor([[1.5], [-0.5], [0.75]]).expand(3, 5).contiguous()  # one advantage per sequence
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    return old, log_prob, advantages, mask


@pytest.mark.parametrize("name", TOKEN_MEAN + SEQUENCE_MEAN)
def test_on_policy_gradient_is_reinforce_under_the_loss_aggregation(name):
    # at rho = 1 every loss's gradient is -A grad log pi, weighted as its aggregation weighs tokens
    old, log_prob, advantages, mask = on_policy_batch()
    loss, _ = get_policy_loss_fn(name)(old, log_prob, advantages, mask, config=actor())
    if name in TOKEN_MEAN:
        expected = -advantages * mask / mask.sum()
    else:  # the mean over sequences of per-sequence token means
        expected = -advantages * mask / mask.sum(dim=-1, keepdim=True) / mask.shape[0]
    torch.testing.assert_close(grad_of(loss, log_prob), expected)


def test_importance_sampling_is_the_unclipped_ratio_surrogate():
    old, new, adv, mask = tokens([0.2, 0.5], [0.3, 0.5], [2.0, -1.0])  # rho = 1.5 and 1
    loss, metrics = compute_policy_loss_importance_sampling(old, new, adv, mask, config=actor())
    assert loss.item() == pytest.approx((-2.0 * 1.5 + 1.0) / 2)
    torch.testing.assert_close(grad_of(loss, new), torch.tensor([[-1.5, 0.5]]))  # -A rho / 2 tokens
    assert metrics["ppo_kl"].item() == pytest.approx(-math.log(1.5) / 2)


def test_up_reinforces_positive_advantages_without_clip_and_clips_the_rest_as_ppo():
    old, new, adv, mask = tokens([0.2], [0.3], [1.0])  # rho = 1.5, beyond PPO's 1.2
    loss, _ = compute_policy_loss_up(old, new, adv, mask, config=actor(clip_ratio=0.2))
    assert loss.item() == pytest.approx(-1.0)  # pi / sg[pi] = 1 in value
    assert grad_of(loss, new).item() == pytest.approx(-1.0)  # and -A grad log pi, where PPO's is 0
    for probs in ([0.5], [0.3], [0.05]):  # A < 0: rho 2.5 (inside the dual clip), 1.5, 0.25 (clipped at 0.8)
        old, new, adv, mask = tokens([0.2], probs, [-1.0])
        up_loss, up_metrics = compute_policy_loss_up(old, new, adv, mask, config=actor(clip_ratio=0.2))
        ppo_loss, ppo_metrics = compute_policy_loss_vanilla(old, new, adv, mask, config=actor(clip_ratio=0.2))
        assert up_loss.item() == pytest.approx(ppo_loss.item())
        assert grad_of(up_loss, new).item() == pytest.approx(grad_of(ppo_loss, new).item())
        assert up_metrics["pg_clipfrac"].item() == ppo_metrics["pg_clipfrac"].item()


def test_cispo_bounds_the_weight_but_keeps_the_gradient_ppo_clips():
    old, new, adv, mask = tokens([0.2], [0.3], [1.0])  # rho = 1.5, beyond 1 + 0.2
    loss, metrics = compute_policy_loss_cispo(old, new, adv, mask, config=actor(clip_ratio=0.2))
    assert loss.item() == pytest.approx(-1.2 * math.log(0.3), rel=1e-6)  # -sg[1.2] A log pi
    assert grad_of(loss, new).item() == pytest.approx(-1.2)
    assert metrics["pg_clipfrac"].item() == 1.0
    ppo_loss, _ = compute_policy_loss_vanilla(old, new, adv, mask, config=actor(clip_ratio=0.2))
    assert grad_of(ppo_loss, new).item() == 0.0  # PPO gives this token nothing
    low, _ = compute_policy_loss_cispo(*tokens([0.5], [0.1], [-1.0]),
                                       config=actor(clip_ratio_low=0.5, clip_ratio_high=0.2))
    assert low.item() == pytest.approx(0.5 * math.log(0.1), rel=1e-6)  # rho = 0.2 weighted 1 - 0.5


def test_sapo_gate_values_and_slopes():
    # f(r) = (4 / tau) sigmoid(tau (r - 1)): f(1) = 2 / tau, f'(r) = 4 s (1 - s)
    loss, _ = compute_policy_loss_sapo(*tokens([0.5], [0.5], [1.0]), config=actor(tau_pos=1.0, tau_neg=1.05))
    assert loss.item() == pytest.approx(-2.0)
    loss, _ = compute_policy_loss_sapo(*tokens([0.5], [0.5], [-1.0]), config=actor(tau_pos=1.0, tau_neg=1.05))
    assert loss.item() == pytest.approx(2 / 1.05)  # the negative advantage's temperature
    old, new, adv, mask = tokens([0.25], [0.5], [1.0])  # r = 2
    loss, _ = compute_policy_loss_sapo(old, new, adv, mask, config=actor(tau_pos=1.0))
    s = 1 / (1 + math.exp(-1.0))
    assert loss.item() == pytest.approx(-4 * s)
    assert grad_of(loss, new).item() == pytest.approx(-4 * s * (1 - s) * 2.0)  # df/dlogp = f'(r) r, nonzero
    with pytest.raises(ValueError, match="tau_pos"):
        compute_policy_loss_sapo(old, new, adv, mask, config=actor(tau_pos=0.0))


@pytest.mark.parametrize(("old_p", "new_p", "adv", "kept_grad"), [
    (0.5, 0.6, 1.0, -1.2),  # A > 0, up by 0.1 <= 0.2: kept, -A min(rho, c) = -1.2
    (0.5, 0.8, 1.0, 0.0),  # A > 0, up by 0.3 > 0.2: out of the region
    (0.5, 0.8, -1.0, 1.6),  # A < 0 moving up is never cut: +rho
    (0.5, 0.2, -1.0, 0.0),  # A < 0, down by 0.3 > 0.2: out
    (0.1, 0.5, -1.0, 3.0),  # rho = 5 truncated at clip_ratio_c = 3
])
def test_dppo_tv_keeps_tokens_inside_the_probability_region(old_p, new_p, adv, kept_grad):
    old, new, advantages, mask = tokens([old_p], [new_p], [adv])
    loss, metrics = compute_policy_loss_dppo_tv(old, new, advantages, mask,
                                                config=actor(clip_ratio=0.2, clip_ratio_c=3.0))
    assert grad_of(loss, new).item() == pytest.approx(kept_grad, rel=1e-5)
    assert metrics["pg_clipfrac"].item() == (1.0 if kept_grad == 0 else 0.0)
    assert metrics["pg_clipfrac_lower"].item() == (1.0 if new_p / old_p > 3 else 0.0)


def test_dppo_kl_bound_is_the_binary_kl():
    # p_old = 0.5 -> p = 0.8: KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231
    divergence = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    for bound, kept in ((divergence - 1e-3, False), (divergence + 1e-3, True)):
        old, new, adv, mask = tokens([0.5], [0.8], [1.0])
        loss, _ = compute_policy_loss_dppo_kl(old, new, adv, mask, config=actor(clip_ratio=bound))
        assert grad_of(loss, new).item() == pytest.approx(-1.6 if kept else 0.0, rel=1e-5)
    old, new, adv, mask = tokens([0.5], [0.8], [-1.0])  # the same move against a negative advantage: kept
    loss, _ = compute_policy_loss_dppo_kl(old, new, adv, mask, config=actor(clip_ratio=0.01))
    assert grad_of(loss, new).item() == pytest.approx(1.6, rel=1e-5)


@pytest.mark.parametrize(("log_ratios", "adv", "expected"), [
    ([0.1, 0.5], 1.0, -math.exp((0.1 + 0.2) / 2)),  # A > 0: 0.5 clipped to 0.2
    ([0.1, 0.5], -1.0, math.exp((0.1 + 0.5) / 2)),  # A < 0: raising is not clipped
    ([-0.5, 0.1], -1.0, math.exp((-0.2 + 0.1) / 2)),  # A < 0: lowering is clipped at -0.2
    ([-0.5, 0.1], 1.0, -math.exp((-0.5 + 0.1) / 2)),  # A > 0: lowering is not clipped
])
def test_geo_mean_clips_each_token_log_ratio_on_the_advantages_side(log_ratios, adv, expected):
    old = torch.tensor([[-1.0, -1.2]])
    new = old + torch.tensor([log_ratios])
    loss, metrics = compute_policy_loss_geo_mean(old, new, torch.full((1, 2), adv), torch.ones(1, 2),
                                                 config=actor(clip_ratio=0.2))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    clipped = sum(abs(r) > 0.2 for r in log_ratios) / 2
    assert metrics["pg_clipfrac" if adv > 0 else "pg_clipfrac_lower"].item() == pytest.approx(clipped)


def test_geo_mean_micro_batches_add_up_and_missing_totals_raise():
    torch.manual_seed(0)
    old = -torch.rand(6, 4, dtype=torch.float64)
    log_prob = (old + 0.3 * torch.randn(6, 4, dtype=torch.float64)).requires_grad_(True)
    advantages = torch.tensor([[1.0], [-1.0], [0.5], [2.0], [-0.5], [0.0]], dtype=torch.float64).expand(6, 4)
    mask = (torch.arange(4) < torch.tensor([[4], [2], [0], [3], [1], [4]])).double()  # row 2 has no tokens
    weights = torch.linspace(0.7, 1.3, 24, dtype=torch.float64).reshape(6, 4)
    whole, _ = compute_policy_loss_geo_mean(old, log_prob, advantages, mask, config=actor(), rollout_is_weights=weights)
    info = {"global_batch_size": 6, "dp_size": 1, "batch_num_tokens": float(mask.sum())}
    parts = [compute_policy_loss_geo_mean(old[s], log_prob[s], advantages[s], mask[s],
                                          config=actor(global_batch_info=info), rollout_is_weights=weights[s])[0]
             for s in (slice(0, 1), slice(1, 5), slice(5, 6))]
    torch.testing.assert_close(sum(parts), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_of(sum(parts), log_prob), grad_of(whole, log_prob), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="geo_mean requires"):
        compute_policy_loss_geo_mean(old, log_prob, advantages, mask,
                                     config=actor(global_batch_info={"global_batch_size": None}))


def test_topr_tapers_only_negative_sequences():
    old = torch.full((3, 2), -1.0)
    log_prob = (old + torch.tensor([[-1.0], [2.0], [0.5]])).requires_grad_(True)  # sequence ratios e^-1, e^2, e^0.5
    advantages = torch.tensor([[-1.0], [1.0], [-1.0]]).expand(3, 2)
    mask = torch.ones(3, 2)
    loss, metrics = compute_policy_loss_topr(old, log_prob, advantages, mask, config=actor())
    weights = torch.tensor([[math.exp(-1.0)], [1.0], [1.0]])  # negative: clip(ratio, 0, 1); positive: 1
    torch.testing.assert_close(grad_of(loss, log_prob), -advantages * weights / 2 / 3)
    assert metrics["topr_taper_weight_mean"].item() == pytest.approx((math.exp(-1.0) + 2) / 3)
    _, raised = compute_policy_loss_topr(old, log_prob, advantages, mask, config=actor(topr_negative_ratio_upper=2.0))
    assert raised["topr_taper_weight_mean"].item() == pytest.approx((math.exp(-1.0) + 1 + math.exp(0.5)) / 3)
    with pytest.raises(ValueError, match="topr_negative_ratio_lower"):
        compute_policy_loss_topr(old, log_prob, advantages, mask, config=actor(topr_negative_ratio_lower=1.5))


@pytest.mark.parametrize("name", TOKEN_MEAN + SEQUENCE_MEAN)
def test_padding_holds_no_gradient_and_changes_nothing(name):
    old, log_prob, advantages, mask = on_policy_batch()
    shifted = (log_prob.detach() + 0.1 * torch.randn_like(old)).requires_grad_(True)
    garbage = shifted.detach().clone()
    garbage[mask == 0] += 50.0
    garbage.requires_grad_(True)
    clean_loss, _ = get_policy_loss_fn(name)(old, shifted, advantages, mask, config=actor())
    dirty_loss, _ = get_policy_loss_fn(name)(old, garbage, advantages, mask, config=actor())
    torch.testing.assert_close(dirty_loss, clean_loss)
    assert torch.all(grad_of(dirty_loss, garbage)[mask == 0] == 0)
