"""verl's `verl.trainer.ppo.rollout_corr_helper`: hybridrl's rollout correction under verl's names, with
verl's DataProto-returning entry point."""

from __future__ import annotations

import torch

from hybridrl.algos.rollout_correction import *  # noqa: F403 - verl's module holds all of these names
from hybridrl.algos.rollout_correction import compute_rollout_correction
from hybridrl.compat.verl_protocol import DataProto


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
    rollout_is: str | None = None, rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False, rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[DataProto | None, torch.Tensor, dict[str, float]]:
    """`compute_rollout_correction` with the IS weights as a DataProto of batch key `rollout_is_weights`
    (None without rollout_is), as verl returns them."""
    weights, mask, metrics = compute_rollout_correction(
        old_log_prob, rollout_log_prob, response_mask, rollout_is=rollout_is,
        rollout_is_threshold=rollout_is_threshold, rollout_is_batch_normalize=rollout_is_batch_normalize,
        rollout_rs=rollout_rs, rollout_rs_threshold=rollout_rs_threshold)
    proto = DataProto.from_dict({"rollout_is_weights": weights}) if weights is not None else None
    return proto, mask, metrics
