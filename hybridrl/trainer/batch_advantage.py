"""Advantages of a whole batch (step 7 of a PPO/GRPO step), under verl's trainer-level names.

`compute_advantage(data, adv_estimator, ...)` hands the registered estimator every input the batch
has (token_level_rewards, response_mask, values, reward_baselines, the prompt uids) and writes
`advantages` and `returns` into the batch. verl's multi-output variant,
`compute_advantage_for_multi_trajectories`, is in hybridrl/compat/verl_functions.py.
"""

from __future__ import annotations

from typing import Any

from hybridrl.algos import AdvantageEstimator
from hybridrl.algos import compute_advantage as run_estimator
from hybridrl.algos.config_args import check_config_object
from hybridrl.protocol import DataProto

# verl's defaults for the settings compute_advantage resolves
_DEFAULTS = {"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True}


def _settings(config: Any, **explicit: Any) -> dict[str, Any]:
    """Each setting from its keyword, else from `config`, else verl's default; a disagreement raises."""
    check_config_object(config, "compute_advantage")
    settings = {}
    for name, value in explicit.items():
        from_config = getattr(config, name, None) if config is not None else None
        if value is not None and from_config is not None and value != from_config:
            raise ValueError(f"compute_advantage: {name}={value!r} was passed but config.{name} is {from_config!r}")
        settings[name] = next(v for v in (value, from_config, _DEFAULTS[name]) if v is not None)
    return settings


def compute_advantage(
    data: DataProto,
    adv_estimator: str | AdvantageEstimator,
    gamma: float | None = None,
    lam: float | None = None,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
) -> DataProto:
    """Set data.batch["advantages"] and ["returns"] (batch, response_len) from `adv_estimator`; returns data.

    gamma, lam and norm_adv_by_std_in_grpo come from the keywords or from `config` (verl's algorithm
    config), else default to 1.0, 1.0 and True; an estimator that takes `config` gets it too (gdpo reads
    its reward keys there). `num_repeat` is accepted and unused, as in verl.
    """
    settings = _settings(config, gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    batch = data.batch
    advantages, returns = run_estimator(
        adv_estimator,
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        values=batch.get("values"),
        reward_baselines=batch.get("reward_baselines"),
        index=data.non_tensor_batch.get("uid"),
        old_log_probs=batch.get("old_log_probs"),
        sum_pi_squared=batch.get("sum_pi_squared"),  # the old log-prob pass's, when the actor computes it
        rollout_is_weights=batch.get("rollout_is_weights"),
        non_tensor_batch=data.non_tensor_batch,  # the reward function's extra outputs (gdpo's components)
        batch=batch,
        config=config,
        **settings,
    )
    batch["advantages"], batch["returns"] = advantages, returns
    return data
