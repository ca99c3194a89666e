"""Advantages of a whole batch (step 7 of a PPO/GRPO step), under verl's trainer-level names.

`compute_advantage(data, adv_estimator, ...)` hands the registered estimator every input the batch
has (token_level_rewards, response_mask, values, reward_baselines, the prompt uids) and writes
`advantages` and `returns` into the batch. `compute_advantage_for_multi_trajectories` is the
agent-loop variant in which one session produces several rows but only its final output is scored.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridrl.algos import AdvantageEstimator
from hybridrl.algos import compute_advantage as run_estimator
from hybridrl.algos.config_args import check_config_object
from hybridrl.protocol import DataProto, DataProtoError

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


def _final_rows(batch_keys: list[str]) -> tuple[list[int], list[int]]:
    """For keys "{uid}_{session}_{output}": the row of each session's last output, and for every row
    the position of its session's final row in that list."""
    final: dict[str, tuple[int, int]] = {}  # session -> (output index, row)
    sessions = []
    for row, key in enumerate(batch_keys):
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not parts[2].isdigit():
            raise DataProtoError(f"batch key {key!r} is not of the form '{{uid}}_{{session_id}}_{{output_index}}'")
        session, output = f"{parts[0]}_{parts[1]}", int(parts[2])
        sessions.append(session)
        if session not in final or final[session][0] < output:
            final[session] = (output, row)
    order = {session: i for i, session in enumerate(final)}
    return [row for _, row in final.values()], [order[s] for s in sessions]


def compute_advantage_for_multi_trajectories(
    data: DataProto,
    batch_keys: list[str],
    adv_estimator: str | AdvantageEstimator,
    gamma: float | None = None,
    lam: float | None = None,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
) -> DataProto:
    """Advantages when an agent-loop session returns several outputs (rows) and only its last is scored.

    For GRPO, the prompt's group is formed by the final output of each session (`batch_keys` names
    every row "{uid}_{session_id}_{output_index}"); each session's advantage -- its final row's value
    at the first response token -- is then given to every row of the session on its response tokens.
    Other estimators see the rows as they are, as verl does (verl applies the per-session treatment to
    GRPO only). Writes into and returns `data`.
    """
    if len(batch_keys) != len(data):
        raise DataProtoError(f"{len(batch_keys)} batch keys for {len(data)} rows")
    kwargs = dict(gamma=gamma, lam=lam, num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                  config=config)
    name = adv_estimator.value if isinstance(adv_estimator, AdvantageEstimator) else adv_estimator
    if name not in (AdvantageEstimator.GRPO.value, AdvantageEstimator.GRPO_VECTORIZED.value):
        return compute_advantage(data, adv_estimator, **kwargs)
    final_rows, session_of_row = _final_rows(batch_keys)
    finals = compute_advantage(data.select_rows(final_rows), adv_estimator, **kwargs)
    first_token = finals.batch["response_mask"].argmax(dim=1)  # (sessions,); 0 for an empty response
    per_session = finals.batch["advantages"][torch.arange(len(finals)), first_token]  # (sessions,)
    mask = data.batch["response_mask"].to(per_session.dtype)
    scores = per_session[session_of_row].unsqueeze(-1) * mask  # (rows, response_len)
    data.batch["advantages"], data.batch["returns"] = scores, scores
    return data
