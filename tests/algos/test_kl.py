"""KL estimators (Schulman's k1/k2/k3), the exact full-distribution KL, and the KL controllers."""

import math

import pytest
import torch

from hybridrl.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)

LOGP = torch.tensor([[-1.0]])
REF = torch.tensor([[-1.5]])


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("kl", "k1"), 0.5),  # logp - ref = -1 + 1.5
        (("abs",), 0.5),
        (("mse", "k2"), 0.125),  # 0.5 * 0.5^2
        # r = e^(ref - logp) = e^-0.5; k3 = r - 1 - log r = 0.60653 - 1 + 0.5 = 0.10653
        (("low_var_kl", "k3"), math.exp(-0.5) + 0.5 - 1),
    ],
)
def test_estimators_hand_values(names, expected):
    for name in names:
        assert kl_penalty(LOGP, REF, name).item() == pytest.approx(expected, rel=1e-6)


def test_k3_is_non_negative_and_clamped():
    torch.manual_seed(0)
    logp, ref = torch.randn(64, 16) * 3, torch.randn(64, 16) * 3
    assert torch.all(kl_penalty(logp, ref, "k3") >= 0)
    # log r = -30 is clamped to -20: e^-20 + 20 - 1 = 19, then clamped to 10
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "k3").item() == 10.0


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    # tokens sampled from the policy p; the sample mean of k1 and k3 approaches KL(p || q)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    exact = (p * (p / q).log()).sum().item()  # 0.5 ln 2.5 + 0.2 ln 0.4 = 0.27489
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, ref = p.log()[tokens], q.log()[tokens]
    assert kl_penalty(logp, ref, "k1").mean().item() == pytest.approx(exact, abs=0.01)
    assert kl_penalty(logp, ref, "k3").mean().item() == pytest.approx(exact, abs=0.01)


def test_full_kl_from_distributions_and_clear_error_for_per_token_input():
    p = torch.tensor([[[0.5, 0.3, 0.2]]])
    q = torch.tensor([[[0.2, 0.3, 0.5]]])
    got = kl_penalty(p.log(), q.log(), "full")
    assert got.shape == (1, 1)
    assert got.item() == pytest.approx(0.5 * math.log(2.5) + 0.2 * math.log(0.4), rel=1e-5)
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "full")


def test_straight_through_variant_keeps_value_and_takes_k2_gradient():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0])
    value = kl_penalty(logp, ref, "k3+")
    torch.testing.assert_close(value, kl_penalty(logp.detach(), ref, "k3"))
    value.sum().backward()
    torch.testing.assert_close(logp.grad, logp.detach() - ref)  # d/dx of x^2 / 2 with x = logp - ref


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(kl_coef=0.05)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05


def test_adaptive_controller_hand_update_and_moves_toward_target():
    ctrl = AdaptiveKLController(init_kl_coef=0.5, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.2, n_steps=10)  # e = clip(0.2 / 0.1 - 1) = 0.2 -> 0.5 * (1 + 0.2 * 10 / 100)
    assert ctrl.value == pytest.approx(0.51)
    ctrl.update(current_kl=0.05, n_steps=10)  # e = clip(-0.5) = -0.2 -> 0.51 * 0.98
    assert ctrl.value == pytest.approx(0.51 * 0.98)
    before = ctrl.value
    for _ in range(5):  # KL above target keeps raising beta, below keeps lowering it
        ctrl.update(current_kl=0.15, n_steps=10)
    assert ctrl.value > before
    for _ in range(20):
        ctrl.update(current_kl=0.01, n_steps=10)
    assert ctrl.value < before


def test_controller_factory_and_validation():
    assert isinstance(get_kl_controller("fixed", kl_coef=0.1), FixedKLController)
    adaptive = get_kl_controller(type="adaptive", kl_coef=0.2, target_kl=0.05, horizon=500)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller("adaptive", kl_coef=0.2, target_kl=0.05, horizon=0)
    with pytest.raises(KeyError, match="adaptive"):
        get_kl_controller("pid")


def test_kl_in_reward_shaping():
    scores = torch.tensor([[0.0, 1.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    ctrl = FixedKLController(0.1)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, "kl")
    # k1 = [0.5, 0, (masked)] -> rewards [0 - 0.1 * 0.5, 1 - 0, 0]; measured KL = (0.5 + 0) / 2
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 1.0, 0.0]]))
    assert metrics == {"actor/reward_kl_penalty": pytest.approx(0.25), "actor/reward_kl_penalty_coeff": 0.1}


def test_kl_penalty_forward_is_the_plain_estimator_and_kl_penalty_adds_the_straight_through():
    from hybridrl.algos import kl_penalty, kl_penalty_forward

    logprob = torch.tensor([[-0.5, -1.5]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0]])
    forward = kl_penalty_forward(logprob, ref, "k3")
    torch.testing.assert_close(forward, kl_penalty(logprob, ref, "k3+"))  # same value
    # d k3 / d logp = 1 - exp(ref - logp); the "+" form has k2's gradient, logp - ref
    torch.testing.assert_close(torch.autograd.grad(forward.sum(), logprob)[0],
                               1 - torch.exp(ref - logprob.detach()))
    plus = kl_penalty(logprob, ref, "k3+")
    torch.testing.assert_close(torch.autograd.grad(plus.sum(), logprob)[0], logprob.detach() - ref)
