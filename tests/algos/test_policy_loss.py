"""Policy losses: hand-worked PPO clipping, exact clip boundaries, gradient signs, registry path."""

import dataclasses
import math

import pytest
import torch

from hybridrl.algos import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dro,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)
from hybridrl.workers.config import ActorConfig, PolicyLossConfig

BUILT_IN = ["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "dro", "importance_sampling", "cispo", "sapo", "dppo_tv",
            "dppo_kl", "geo_mean", "topr", "up"]
POLICY_LOSS_FIELDS = {field.name for field in dataclasses.fields(PolicyLossConfig)}


def actor(**settings) -> ActorConfig:
    """An actor config with `settings` (those under actor.policy_loss by their own names)."""
    nested = {name: settings.pop(name) for name in list(settings) if name in POLICY_LOSS_FIELDS}
    return ActorConfig(**settings, policy_loss=PolicyLossConfig(**nested))


# one config for every loss, as the actor passes it
ACTOR = actor(clip_ratio_low=0.2, clip_ratio_high=0.28, ppo_kl_coef=1.0, dro_beta=0.1)


def pg_loss(name, *tensors, loss_agg_mode="token-mean", config=ACTOR, **kwargs):
    return get_policy_loss_fn(name)(*tensors, loss_agg_mode, config, **kwargs)


def one_token(log_ratio, advantage, requires_grad=False):
    """(old_log_prob, log_prob, advantages, mask) for a single token with the given log-ratio."""
    old = torch.tensor([[-1.0]])
    new = (old + log_ratio).clone().requires_grad_(requires_grad)
    return old, new, torch.tensor([[float(advantage)]]), torch.ones(1, 1)


@pytest.mark.parametrize(
    ("log_ratio", "adv", "expected", "clipfrac", "clipfrac_lower"),
    [
        (0.1, 1.0, -math.exp(0.1), 0.0, 0.0),  # rho = 1.105 inside [0.8, 1.2]: -A rho = -1.105
        (0.3, 1.0, -1.2, 1.0, 0.0),  # rho = 1.350 > 1.2, A > 0: clipped to -1.2
        (math.log(0.7), -1.0, 0.8, 1.0, 0.0),  # rho = 0.7 < 0.8, A < 0: max(0.7, 0.8) = 0.8
        (math.log(5.0), -1.0, 3.0, 0.0, 1.0),  # rho = 5, A < 0: max(5, 1.2) = 5, dual clip min(5, 3) = 3
        (math.log(0.5), 1.0, -0.5, 0.0, 0.0),  # rho = 0.5, A > 0: max(-0.5, -0.8) = -0.5, no clip
    ],
)
def test_vanilla_ppo_hand_values(log_ratio, adv, expected, clipfrac, clipfrac_lower):
    loss, metrics = compute_policy_loss_vanilla(*one_token(log_ratio, adv),
                                                config=actor(clip_ratio=0.2, clip_ratio_c=3.0))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["pg_clipfrac"].item() == clipfrac
    assert metrics["pg_clipfrac_lower"].item() == clipfrac_lower
    assert metrics["ppo_kl"].item() == pytest.approx(-log_ratio, abs=1e-6)  # mean(old - new)


def test_asymmetric_clip_higher():
    settings = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    # rho = 1.25 is inside [0.8, 1.28]: unclipped; rho = 1.3 is clipped to 1.28
    loss, _ = compute_policy_loss_vanilla(*one_token(math.log(1.25), 1.0), config=actor(**settings))
    assert loss.item() == pytest.approx(-1.25, rel=1e-5)
    loss, _ = compute_policy_loss_vanilla(*one_token(math.log(1.3), 1.0), config=actor(**settings))
    assert loss.item() == pytest.approx(-1.28, rel=1e-5)


def grad_at_ratio(ratio, adv, **settings):
    old, new, advantages, mask = one_token(math.log(ratio), adv, requires_grad=True)
    loss, _ = compute_policy_loss_vanilla(old, new, advantages, mask, config=actor(**settings))
    loss.backward()
    return new.grad.item()


@pytest.mark.parametrize(
    ("bound", "adv", "settings"),
    [
        (1.2, 1.0, {"clip_ratio": 0.2}),  # upper clip for A > 0
        (1.28, 1.0, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}),
        (0.8, -1.0, {"clip_ratio": 0.2}),  # lower clip for A < 0
        (0.9, -1.0, {"clip_ratio_low": 0.1, "clip_ratio_high": 0.28}),
        (3.0, -1.0, {"clip_ratio": 0.2, "clip_ratio_c": 3.0}),  # dual clip for A < 0
    ],
)
def test_clipping_switches_on_exactly_at_the_configured_ratio(bound, adv, settings):
    inside = bound * (1 - 1e-3) if bound > 1 else bound * (1 + 1e-3)
    outside = bound * (1 + 1e-3) if bound > 1 else bound * (1 - 1e-3)
    if bound == 3.0:  # between the PPO clip and the dual clip the gradient is still live
        inside, outside = 2.99, 3.01
    # inside the trust region the gradient of -A rho w.r.t. logp is -A rho; beyond it the loss is flat
    assert grad_at_ratio(inside, adv, **settings) == pytest.approx(-adv * inside, rel=1e-5)
    assert grad_at_ratio(outside, adv, **settings) == 0.0


def test_bad_clip_settings_raise():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss_vanilla(*one_token(0.0, 1.0), config=actor(clip_ratio_c=1.0))
    with pytest.raises(ValueError, match="clip_ratio_low"):
        compute_policy_loss_vanilla(*one_token(0.0, 1.0), config=actor(clip_ratio_low=1.5))


def test_gspo_sequence_ratio_hand_values():
    old = torch.zeros(1, 3)
    # valid log-ratios 0.1 and 0.3 -> s = exp(0.2) = 1.2214; the padded token's 5.0 is ignored
    new = torch.tensor([[0.1, 0.3, 5.0]], requires_grad=True)
    adv = torch.ones(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = compute_policy_loss_gspo(old, new, adv, mask, config=actor(clip_ratio=0.2))
    assert loss.item() == pytest.approx(-1.2, rel=1e-5)  # s > 1.2: clipped
    assert metrics["pg_clipfrac"].item() == 1.0
    loss, _ = compute_policy_loss_gspo(old, new, adv, mask,
                                       config=actor(clip_ratio_low=0.2, clip_ratio_high=0.3))
    assert loss.item() == pytest.approx(-math.exp(0.2), rel=1e-5)
    loss.backward()
    # d/dlogp_t of -A s with s = exp(mean_t log-ratio): -A s / |y| = -1.2214 / 2 per valid token
    torch.testing.assert_close(new.grad, torch.tensor([[-math.exp(0.2) / 2, -math.exp(0.2) / 2, 0.0]]))


def test_gpg_is_plain_reinforce():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = compute_policy_loss_gpg(logp.detach(), logp, torch.ones(1, 2), torch.ones(1, 2), config=actor())
    assert loss.item() == pytest.approx(1.5)  # mean(-1 * -1, -1 * -2) = (1 + 2) / 2
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5]]))


def test_clip_cov_drops_the_configured_share_of_high_covariance_tokens():
    # A = [2, -2, 0, 0] (mean 0), logp = [-1, -3, -2, -2] (mean -2): covariance terms [2, 2, 0, 0];
    # the first two lie in (lb, ub) = (1, 5). Ratio 1 everywhere, so PPO clipping is inactive.
    logp = torch.tensor([[-1.0, -3.0, -2.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -2.0, 0.0, 0.0]])
    mask = torch.ones(1, 4)
    torch.manual_seed(0)  # the dropped token is drawn from the CPU generator
    loss, metrics = compute_policy_loss_clip_cov(logp.detach(), logp, adv, mask, config=actor(clip_cov_ratio=0.25))
    # max(1, int(0.25 * 4)) = 1 token dropped: per-token losses -A = [-2, 2, 0, 0] minus one of the first two
    assert abs(loss.item()) == pytest.approx(0.5)  # (+-2) / 4
    assert metrics["pg_clipfrac"].item() == 0.25
    loss.backward()
    assert (logp.grad[0, :2] == 0).sum().item() == 1  # exactly one candidate lost its gradient
    loss, metrics = compute_policy_loss_clip_cov(logp.detach(), logp, adv, mask, config=actor(clip_cov_ratio=0.5))
    assert loss.item() == 0.0 and metrics["pg_clipfrac"].item() == 0.5  # both candidates dropped


def test_kl_cov_penalises_the_top_covariance_token():
    # A = [3, -1, -1, -1] (mean 0), logp = [-1, -3, -2, -2] (mean -2): covariance [3, 1, 0, 0] -> token 0
    logp = torch.tensor([[-1.0, -3.0, -2.0, -2.0]])
    old = logp - 0.1  # rho = e^0.1 = 1.10517 and |log-ratio| = 0.1 on every token
    adv = torch.tensor([[3.0, -1.0, -1.0, -1.0]])
    loss, metrics = compute_policy_loss_kl_cov(old, logp, adv, torch.ones(1, 4),
                                               config=actor(kl_cov_ratio=0.25, ppo_kl_coef=1.0))
    # -A rho sums to 0 over the tokens; token 0 adds 1.0 * 0.1 -> 0.1 / 4 = 0.025
    assert loss.item() == pytest.approx(0.025, abs=1e-6)
    assert metrics["ppo_kl"].item() == pytest.approx(0.1, abs=1e-6)


@pytest.mark.parametrize("name", BUILT_IN)
def test_gradient_sign_pushes_logp_toward_positive_advantage(name):
    old = torch.tensor([[-1.0, -1.5, -0.7], [-2.0, -0.4, -1.1]])
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]])
    loss, _ = pg_loss(name, old, logp, adv, torch.ones(2, 3))
    loss.backward()
    # gradient descent raises logp where A > 0 and lowers it where A < 0
    assert torch.all(logp.grad[0] < 0) and torch.all(logp.grad[1] > 0), logp.grad


@pytest.mark.parametrize("name", BUILT_IN)
def test_all_masked_rows_and_padding_give_finite_loss_and_grad(name):
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    logp = torch.tensor([[-0.9, -1.2, 40.0], [30.0, -50.0, 10.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        loss, metrics = pg_loss(name, old, logp, adv, mask, loss_agg_mode=agg)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
        assert all(torch.isfinite(v) for v in metrics.values())
        assert torch.all(logp.grad[1] == 0)
        logp.grad = None


@pytest.fixture
def scratch_losses():
    names: list[str] = []
    yield names
    for name in names:
        POLICY_LOSS_REGISTRY._entries.pop(name, None)  # no public removal by design


def test_user_registered_loss_runs_through_the_actor_path(scratch_losses):
    scratch_losses.append("test_signed_ratio")

    # verl's call: the settings are the actor config's attributes
    @register_policy_loss("test_signed_ratio")
    def signed_ratio(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     rollout_is_weights=None):
        ratio = torch.clamp(torch.exp(log_prob - old_log_prob), max=1 + config.clip_ratio)
        loss = -(advantages * ratio * response_mask).sum() / response_mask.sum()
        return loss, {"pg_clipfrac": torch.tensor(0.0)}

    assert get_policy_loss_fn("test_signed_ratio") is signed_ratio
    old, new, adv, mask = one_token(0.0, 2.0)
    loss, _ = pg_loss("test_signed_ratio", old, new, adv, mask)
    assert loss.item() == pytest.approx(-2.0)  # -A * rho = -2 * 1
    loss, _ = pg_loss("test_signed_ratio", *one_token(1.0, 2.0), config=actor(clip_ratio=0.5))
    assert loss.item() == pytest.approx(-3.0)  # rho = e is capped at 1.5
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("test_signed_ratio")(signed_ratio)


def test_a_missing_config_or_a_number_in_its_place_and_an_unknown_mode_are_rejected():
    for config in (None, 0.2):  # 0.2: an old positional clip ratio
        with pytest.raises(TypeError, match="reads its settings from `config`, the actor config"):
            compute_policy_loss_vanilla(*one_token(0.0, 1.0), "token-mean", config)
    with pytest.raises(KeyError, match="vanilla"):
        get_policy_loss_fn("ppo")
    assert set(BUILT_IN) <= set(POLICY_LOSS_REGISTRY.names())


def test_micro_batch_losses_add_up_with_global_batch_info():
    # Two micro-batches of a 3-row mini-batch: with the mini-batch totals passed in, the sum of the
    # micro-batch losses equals the loss of the whole mini-batch, for every aggregation mode.
    torch.manual_seed(0)
    old, new, adv = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    for mode in ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        whole, _ = pg_loss("vanilla", old, new, adv, mask, loss_agg_mode=mode)
        config = dataclasses.replace(ACTOR, global_batch_info={"batch_num_tokens": mask.sum(), "global_batch_size": 3})
        parts = [pg_loss("vanilla", old[s], new[s], adv[s], mask[s], loss_agg_mode=mode, config=config)[0]
                 for s in (slice(0, 2), slice(2, 3))]
        torch.testing.assert_close(parts[0] + parts[1], whole)


def test_vanilla_takes_its_clip_range_from_a_verl_style_config():
    # rho = 1.25, A = 1: clip_ratio 0.01 from the config clips at 1.01 -> -1.01 (the default 0.2 gives -1.2)
    loss, _ = compute_policy_loss_vanilla(*one_token(math.log(1.25), 1.0), config=ActorConfig(clip_ratio=0.01))
    assert loss.item() == pytest.approx(-1.01)


def test_rollout_is_weights_scale_each_token_loss():
    # rho = e^0.1 inside the clip range, A = 1: -1.105 per token, times the weight 0.5 -> -0.553
    old, new, adv, mask = one_token(0.1, 1.0)
    for name in ["vanilla", "gpg", "dro"]:
        plain, _ = pg_loss(name, old, new, adv, mask)
        weighted, _ = pg_loss(name, old, new, adv, mask, rollout_is_weights=torch.tensor([[0.5]]))
        assert weighted.item() == pytest.approx(0.5 * plain.item()), name
    loss, _ = compute_policy_loss_vanilla(old, new, adv, mask, config=actor(),
                                          rollout_is_weights=torch.tensor([[0.5]]))
    assert loss.item() == pytest.approx(-0.5 * math.exp(0.1))


def test_dro_loss_by_hand_and_its_beta_is_required():
    # logp -0.8, old -1.0 (log-ratio 0.2), A = 2, beta 0.5: -(2 * -0.8 - 0.25 * 0.04) = 1.61
    old, new, adv, mask = torch.tensor([[-1.0]]), torch.tensor([[-0.8]]), torch.tensor([[2.0]]), torch.ones(1, 1)
    loss, metrics = compute_policy_loss_dro(old, new, adv, mask, config=actor(dro_beta=0.5))
    assert loss.item() == pytest.approx(1.61)
    assert metrics["ppo_kl"].item() == pytest.approx(-0.2)
    config = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="dro", dro_beta=0.5))
    assert compute_policy_loss_dro(old, new, adv, mask, "token-mean", config)[0].item() == pytest.approx(1.61)
    with pytest.raises(ValueError, match="dro_beta"):
        compute_policy_loss_dro(old, new, adv, mask, "token-mean", ActorConfig())


def test_a_loss_that_cannot_apply_rollout_weights_refuses_them(scratch_losses):
    scratch_losses.append("test_no_weights")

    @register_policy_loss("test_no_weights")
    def no_weights(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
        return (log_prob * 0).sum(), {}

    assert no_weights(*one_token(0.0, 1.0), config=ACTOR)[0].item() == 0.0
    with pytest.raises(ValueError, match="does not apply rollout_is_weights"):
        no_weights(*one_token(0.0, 1.0), config=ACTOR, rollout_is_weights=torch.ones(1, 1))


def test_metrics_answer_to_verls_actor_prefixed_names_too():
    _, metrics = compute_policy_loss_vanilla(*one_token(0.3, 1.0), config=actor(clip_ratio=0.2))
    assert metrics["actor/pg_clipfrac"] is metrics["pg_clipfrac"]
    assert set(metrics) == {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}  # what the actor iterates and logs
    with pytest.raises(KeyError):
        metrics["actor/no_such_metric"]
