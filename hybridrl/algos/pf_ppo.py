"""PF-PPO: resample the batch toward responses whose reward is most reliable.

Policy Filtration for PPO (Zhang et al. 2024, https://arxiv.org/abs/2409.06957): a reward model is most
trustworthy at the extremes of its scale, so the batch the critic and actor train on is redrawn, with
replacement and as many rows as it had, with probabilities from each response's score s (the sum of its
`token_level_scores`):

    pow         |s|^p                        (p = weight_pow)
    max_min     1 for the batch's highest and lowest score, 0 otherwise
    max_random  0.4 for the highest score, 0.1 otherwise

Every weight gets 1e-8 added, so a batch of zero scores is drawn uniformly. verl applies it after GAE's
advantages (`algorithm.use_pf_ppo`, `algorithm.pf_ppo.*`), and so does hybridrl.
"""

from __future__ import annotations

import torch

from hybridrl.protocol import DataProto

PF_PPO_METHODS = ("pow", "max_min", "max_random")


@torch.no_grad()
def pf_ppo_weights(scores: torch.Tensor, reweight_method: str = "pow", weight_pow: float = 2.0) -> torch.Tensor:
    """Sampling weights (batch,) for sequence scores (batch,), per the module docstring (before the 1e-8)."""
    if reweight_method == "pow":
        return scores.abs().pow(weight_pow)
    if reweight_method == "max_min":
        return ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    if reweight_method == "max_random":
        return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    raise ValueError(f"algorithm.pf_ppo.reweight_method must be one of {PF_PPO_METHODS}, got {reweight_method!r}")


@torch.no_grad()
def compute_pf_ppo_reweight_data(data: DataProto, reweight_method: str = "pow", weight_pow: float = 2.0,
                                 generator: torch.Generator | None = None) -> DataProto:
    """The batch redrawn with replacement by `pf_ppo_weights` of its scores (verl's name); every column
    follows its row. `generator` (a CPU generator) makes the draw reproducible, e.g. across a resume."""
    if "token_level_scores" not in data.batch:
        raise KeyError("PF-PPO resamples by the batch column 'token_level_scores' (the reward), which is missing")
    scores = data.batch["token_level_scores"].sum(dim=-1).float().cpu()  # (batch,)
    weights = pf_ppo_weights(scores, reweight_method, weight_pow) + 1e-8
    rows = torch.multinomial(weights, len(data), replacement=True, generator=generator)
    return data.select_rows(rows)
