"""verl's `verl.trainer.ppo.v1.utils`: hybridrl's batch advantages, and verl's multi-output session variant
that nothing in hybridrl's own agent loop produces (one session, one row)."""

from __future__ import annotations

from typing import Any

import torch

from hybridrl.algos import AdvantageEstimator
from hybridrl.protocol import DataProto, DataProtoError
from hybridrl.trainer.dataflow import compute_advantage

__all__ = ["compute_advantage", "compute_advantage_for_multi_trajectories"]


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
