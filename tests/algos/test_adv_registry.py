"""The estimator registry and the uniform compute_advantage path the trainer uses."""

import numpy as np
import pytest
import torch

from hybridrl.algos import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    get_adv_estimator_fn,
    get_adv_estimator_spec,
    register_adv_est,
)
from hybridrl.trainer.ppo_config import AlgorithmConfig

REWARDS = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
# everything a trainer might have at hand; each estimator takes what its signature asks for
EVERYTHING = {
    "values": torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.1, 0.2], [0.5, 0.0, 0.0], [0.0, 0.4, 0.0]]),
    "index": np.array(["p0", "p0", "p1", "p1"], dtype=object),
    "reward_baselines": torch.tensor([0.5, 0.5, 1.0, 1.0]),
    "gamma": 1.0,
    "lam": 0.95,
    "norm_adv_by_std_in_grpo": True,
    "old_log_probs": torch.tensor([[-0.5, -1.0, 0.0], [-0.2, -2.0, -0.7], [-1.5, 0.0, 0.0], [-0.1, -0.9, 0.0]]),
    "sum_pi_squared": torch.tensor([[0.4, 0.3, 0.0], [0.6, 0.2, 0.5], [0.3, 0.0, 0.0], [0.8, 0.4, 0.0]]),
    # the algorithm config: reinforce_plus_plus reads its gamma there, gdpo its reward keys
    "config": AlgorithmConfig(gamma=1.0, lam=0.95, gdpo_reward_keys=["accuracy"]),
    "non_tensor_batch": {"accuracy": np.array([1.0, 0.0, 0.0, 1.0])},
}


@pytest.fixture
def scratch_names():
    """Names registered by a test are removed afterwards so tests stay independent."""
    names: list[str] = []
    yield names
    for name in names:
        ADV_ESTIMATOR_REGISTRY._entries.pop(name, None)  # clear() would remove the built-ins too


def test_all_verl_estimators_are_registered():
    assert {e.value for e in AdvantageEstimator} <= set(ADV_ESTIMATOR_REGISTRY.names())
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn("gae") is compute_gae_advantage_return


def test_specs_declare_inputs_and_critic_need():
    gae = get_adv_estimator_spec("gae")
    assert gae.needs_critic and set(gae.required_inputs) == {"values", "gamma", "lam"}
    assert get_adv_estimator_spec("remax").required_inputs == ("reward_baselines",)
    # verl's call: reinforce_plus_plus reads gamma from the algorithm config
    assert get_adv_estimator_spec("reinforce_plus_plus").required_inputs == ("config",)
    grpo = get_adv_estimator_spec("grpo")
    assert grpo.required_inputs == ("index",) and "norm_adv_by_std_in_grpo" in grpo.optional_inputs
    assert [n for n in ADV_ESTIMATOR_REGISTRY if get_adv_estimator_spec(n).needs_critic] == ["gae"]


@pytest.mark.parametrize("name", [e.value for e in AdvantageEstimator])
def test_uniform_path_equals_direct_call(name):
    spec = get_adv_estimator_spec(name)
    adv, ret = compute_advantage(name, token_level_rewards=REWARDS, response_mask=MASK, **EVERYTHING)
    direct_kwargs = {k: v for k, v in EVERYTHING.items() if k in spec.parameters}
    adv_d, ret_d = spec.fn(token_level_rewards=REWARDS, response_mask=MASK, **direct_kwargs)
    torch.testing.assert_close(adv, adv_d)
    torch.testing.assert_close(ret, ret_d)
    assert adv.shape == REWARDS.shape and torch.isfinite(adv).all()
    assert torch.all(adv[MASK == 0] == 0)


def test_missing_input_names_the_input_and_its_source():
    with pytest.raises(ValueError, match=r"'gae' needs input\(s\) \['values'\].*critic"):
        compute_advantage(
            "gae", token_level_rewards=REWARDS, response_mask=MASK, values=None, gamma=1.0, lam=1.0
        )
    with pytest.raises(ValueError, match="uid"):
        compute_advantage("rloo", token_level_rewards=REWARDS, response_mask=MASK)


def test_unknown_estimator_lists_registered_names():
    with pytest.raises(KeyError, match="grpo"):
        compute_advantage("grpoo", token_level_rewards=REWARDS, response_mask=MASK)
    with pytest.raises(ValueError, match="Unknown advantage estimator simply: GAE"):  # verl's error type
        get_adv_estimator_fn("GAE")


def test_registering_the_same_function_again_is_harmless(scratch_names):
    scratch_names.append("test_twice")
    register_adv_est("test_twice")(compute_grpo_outcome_advantage)
    register_adv_est("test_twice")(compute_grpo_outcome_advantage)
    assert ADV_ESTIMATOR_REGISTRY["test_twice"] is compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("test_twice")(compute_gae_advantage_return)


def test_user_estimator_registered_by_name_runs_through_the_uniform_path(scratch_names):
    scratch_names.append("test_max_baseline")

    @register_adv_est("test_max_baseline")
    def max_baseline(token_level_rewards, response_mask, index, scale=1.0):
        """A_i = scale * (s_i - max_g s): a deliberately simple custom estimator."""
        scores = token_level_rewards.sum(-1)
        best = {
            uid: max(s for s, u in zip(scores.tolist(), index, strict=True) if u == uid) for uid in set(index)
        }
        adv = scale * (scores - torch.tensor([best[u] for u in index])).unsqueeze(-1) * response_mask
        return adv, adv

    spec = get_adv_estimator_spec("test_max_baseline")
    assert spec.required_inputs == ("index",) and spec.optional_inputs == ("scale",) and not spec.needs_critic
    adv, _ = compute_advantage(
        "test_max_baseline", token_level_rewards=REWARDS, response_mask=MASK, **EVERYTHING
    )
    # scores [1, 0, 2, 3]; p0 best 1 -> [0, -1]; p1 best 3 -> [-1, 0]
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, -1.0, -1.0, 0.0]))
    with pytest.raises(ValueError, match="already registered"):  # another function under a taken name
        register_adv_est("test_max_baseline")(compute_grpo_outcome_advantage)


def test_estimator_with_var_kwargs_receives_every_input(scratch_names):
    scratch_names.append("test_sees_all")
    seen = {}

    @register_adv_est("test_sees_all", needs_critic=True)
    def sees_all(token_level_rewards, response_mask, **inputs):
        seen.update(inputs)
        return token_level_rewards * 0, token_level_rewards * 0

    compute_advantage("test_sees_all", token_level_rewards=REWARDS, response_mask=MASK, **EVERYTHING)
    assert set(seen) == set(EVERYTHING)
    assert get_adv_estimator_spec("test_sees_all").needs_critic


def test_bad_user_estimators_are_caught(scratch_names):
    # registration takes any function (as verl's does); reading its spec, as the trainer does before
    # any worker starts, rejects one that cannot be called as an estimator
    scratch_names.append("test_no_mask")
    register_adv_est("test_no_mask")(lambda token_level_rewards, index: (token_level_rewards,) * 2)
    with pytest.raises(TypeError, match="response_mask"):
        get_adv_estimator_spec("test_no_mask")
    scratch_names.append("test_wrong_shape")

    @register_adv_est("test_wrong_shape")
    def wrong_shape(token_level_rewards, response_mask):
        return token_level_rewards.sum(-1), token_level_rewards

    with pytest.raises(ValueError, match=r"advantages of shape \(4,\)"):
        compute_advantage("test_wrong_shape", token_level_rewards=REWARDS, response_mask=MASK)
