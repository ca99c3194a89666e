"""Rollout engines: turn left-padded prompts into sampled responses with masks and log-probs.
`build_rollout(config, ...)` picks the engine `rollout.name` names: "hf" (default) or "vllm" (optional;
importing this package never imports vllm)."""

from hybridrl.workers.config import RolloutConfig, ValKwargs
from hybridrl.workers.rollout import vllm as _vllm  # noqa: F401  (registers "vllm" without importing vllm)
from hybridrl.workers.rollout.base import (
    ROLLOUT_ENGINES,
    BaseRollout,
    build_rollout,
    rollout_logprob_diff_metrics,
)
from hybridrl.workers.rollout.hf import HFRollout
from hybridrl.workers.rollout.sampling import SamplingParams, resolve_sampling_params

__all__ = [
    "ROLLOUT_ENGINES",
    "BaseRollout",
    "HFRollout",
    "RolloutConfig",
    "SamplingParams",
    "ValKwargs",
    "build_rollout",
    "resolve_sampling_params",
    "rollout_logprob_diff_metrics",
]
