"""verl's core_algos call conventions that the core leaves to compat (hybridrl/compat.py)."""

import pytest
import torch

from hybridrl.algos import compute_policy_loss_vanilla
from hybridrl.compat import compute_policy_loss
from hybridrl.workers.config import ActorConfig


def test_verls_deprecated_compute_policy_loss_is_vanilla_with_four_returns():
    torch.manual_seed(1)
    old, new, adv = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    with pytest.warns(DeprecationWarning, match="compute_policy_loss_vanilla"):
        loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(old, new, adv, mask, cliprange=0.2,
                                                                     cliprange_high=0.28, clip_ratio_c=3.0)
    expected, metrics = compute_policy_loss_vanilla(old, new, adv, mask,
                                                    config=ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28))
    torch.testing.assert_close(loss, expected)
    assert (clipfrac, ppo_kl, clipfrac_lower) == (metrics["pg_clipfrac"], metrics["ppo_kl"],
                                                  metrics["pg_clipfrac_lower"])
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="needs cliprange"):
        compute_policy_loss(old, new, adv, mask)
