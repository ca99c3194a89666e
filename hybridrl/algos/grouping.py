"""Per-prompt group statistics for outcome-reward estimators (GRPO, RLOO, OPO, GPG, ...).

Responses sampled from the same prompt share a uid; these helpers turn the uid array into integer
group ids and compute each group's size, mean and unbiased standard deviation with scatter-adds, so
estimators are vectorised instead of looping over the batch in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def group_ids(index: np.ndarray | Sequence[Any] | torch.Tensor, batch_size: int) -> tuple[torch.Tensor, int]:
    """Map each sample's prompt uid to a dense group id 0..n_groups-1 (in order of first appearance).

    Returns:
        gid: (batch,) int64 group id per sample; n_groups: number of distinct uids.
    """
    keys = (
        index.tolist()
        if isinstance(index, torch.Tensor)
        else list(np.asarray(index, dtype=object).reshape(-1))
    )
    if len(keys) != batch_size:
        raise ValueError(
            f"index has {len(keys)} entries but the batch has {batch_size} responses; pass one prompt uid "
            f"per response (non_tensor_batch['uid'] after repeating the batch rollout.n times)"
        )
    dense: dict[Any, int] = {}
    gid = [dense.setdefault(key, len(dense)) for key in keys]
    return torch.tensor(gid, dtype=torch.long), len(dense)


def group_sum(values: torch.Tensor, gid: torch.Tensor, n_groups: int) -> torch.Tensor:
    """sum of `values` (batch,) within each group -> (n_groups,)."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(
        0, gid.to(values.device), values
    )


def group_mean_std(
    scores: torch.Tensor, gid: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group size, mean and unbiased std of `scores` (batch,), each returned as (n_groups,).

    A group of one response gets mean 0 and std 1 (verl's convention): its advantage is then its raw
    score, since there is no peer to form a baseline from, and nothing divides by zero.
    """
    gid = gid.to(scores.device)
    count = group_sum(torch.ones_like(scores), gid, n_groups)  # (n_groups,)
    mean = group_sum(scores, gid, n_groups) / count
    centred_sq = (scores - mean[gid]) ** 2  # (batch,)
    std = torch.sqrt(group_sum(centred_sq, gid, n_groups) / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return count, mean, std
