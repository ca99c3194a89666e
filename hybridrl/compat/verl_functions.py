"""verl's module functions over hybridrl's core, for the verl modules whose names compat/verl_shim.py maps
here: `verl.utils.tensordict_utils` (`get_tensordict`), `verl.trainer.ppo.rollout_corr_helper` (hybridrl's
rollout correction under verl's names, with verl's DataProto-returning entry point) and
`verl.trainer.ppo.v1.utils` (batch advantages, and verl's multi-output session variant that nothing in
hybridrl's own agent loop produces: one session, one row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hybridrl import protocol as core
from hybridrl.algos import AdvantageEstimator
from hybridrl.algos.rollout_correction import *  # noqa: F403 - verl's rollout_corr_helper holds all of these names
from hybridrl.algos.rollout_correction import compute_rollout_correction
from hybridrl.compat.verl_protocol import DataProto, DataProtoError, non_tensor_stack, require_tensordict
from hybridrl.trainer.dataflow import compute_advantage

# ---------------------------------------------------------------- verl.utils.tensordict_utils


def get_tensordict(tensor_dict: Mapping[str, Any], non_tensor_dict: Mapping[str, Any] | None = None):
    """A TensorDict with one batch dimension from per-row columns and per-batch values.

    tensor_dict: tensors (rows, ...) and per-row Python values (lists or arrays, one entry per row);
    non_tensor_dict: values for the whole batch (verl's meta_info), stored as NonTensorData.
    """
    td = require_tensordict()
    rows = {len(value) for value in tensor_dict.values()}
    if len(rows) > 1:
        raise ValueError(f"get_tensordict: columns disagree on the number of rows: {sorted(rows)}")
    source = {key: value if isinstance(value, torch.Tensor) else non_tensor_stack(value)
              for key, value in tensor_dict.items()}
    out = td.TensorDict(source, batch_size=[rows.pop()] if rows else [])
    for key, value in (non_tensor_dict or {}).items():
        if key in out.keys():  # noqa: SIM118 - TensorDict refuses `in` without .keys()
            raise ValueError(f"get_tensordict: {key!r} is both a column and a batch-wide value")
        out[key] = td.NonTensorData(value)
    return out


# ---------------------------------------------------------------- verl.trainer.ppo.rollout_corr_helper


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


# ---------------------------------------------------------------- verl.trainer.ppo.v1.utils


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
    data: core.DataProto,
    batch_keys: list[str],
    adv_estimator: str | AdvantageEstimator,
    gamma: float | None = None,
    lam: float | None = None,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
) -> core.DataProto:
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
