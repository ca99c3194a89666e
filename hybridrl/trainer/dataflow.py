"""Driver-side steps of the PPO dataflow that act on a whole batch: pure functions on DataProto."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import torch

from hybridrl.data.seqlen_balancing import get_seqlen_balanced_partitions, log_seqlen_unbalance
from hybridrl.protocol import DataProto

PROMPT_TENSORS = ["input_ids", "attention_mask", "position_ids"]


def new_prompt_batch(batch_dict: dict) -> DataProto:
    """A DataProto of prompts from the dataloader, each with a fresh `uid` (its GRPO group id)."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    return batch


def split_generation_input(batch: DataProto, columns: Sequence[str] = ()) -> DataProto:
    """Take the prompt tensors out of `batch` (the rollout's input); everything else stays.

    `columns` are non-tensor columns the rollout reads too (the agent loop's `extra_info`, `agent_name`):
    they are copied into the input, and stay in `batch`. Absent ones are skipped.
    """
    generation_input = batch.pop(batch_keys=PROMPT_TENSORS)
    for key in columns:
        if key in batch.non_tensor_batch:
            generation_input.non_tensor_batch[key] = batch.non_tensor_batch[key]
    return generation_input


def attach_responses(batch: DataProto, generated: DataProto) -> DataProto:
    """Repeat each prompt row once per sample (interleaved, as the rollout orders them) and merge."""
    n = len(generated) // len(batch)
    if n * len(batch) != len(generated):
        raise ValueError(f"the rollout returned {len(generated)} rows for {len(batch)} prompts")
    return batch.repeat(n, interleave=True).union(generated)


def balance_batch(batch: DataProto, world_size: int, keep_groups: bool = False) -> dict[str, float]:
    """Reorder rows so each data-parallel rank's contiguous chunk holds a similar number of tokens.

    Ranks work in lockstep (FSDP collectives), so the step takes as long as the busiest rank.
    `keep_groups`: the rows of a prompt (one `uid`) go to one rank together, so that rank computes the
    prompt once (`actor_rollout_ref.model.share_prompt_forward`); whole groups are balanced by their
    tokens, where the groups are of one size and divide evenly among the ranks (otherwise rows are).
    """
    lengths = batch.batch["attention_mask"].sum(dim=-1).tolist()  # (batch,) real tokens
    groups = _equal_groups(batch, world_size) if keep_groups and world_size > 1 else None
    if groups is not None:
        group_tokens = [sum(lengths[i] for i in rows) for rows in groups]
        chosen = get_seqlen_balanced_partitions(group_tokens, k_partitions=world_size, equal_size=True)
        partitions = [[i for g in sorted(part) for i in groups[g]] for part in chosen]
    else:
        partitions = get_seqlen_balanced_partitions(lengths, k_partitions=world_size, equal_size=True)
    order = torch.tensor([i for part in partitions for i in sorted(part)])
    batch.reorder(order)
    return log_seqlen_unbalance(lengths, partitions, prefix="global_seqlen")


def _equal_groups(batch: DataProto, world_size: int) -> list[list[int]] | None:
    """Row indices of each `uid` in order of appearance, if every group has the same number of rows and
    the groups divide evenly among `world_size` ranks; else None."""
    if "uid" not in batch.non_tensor_batch:
        return None
    rows_of: dict[object, list[int]] = {}
    for i, uid in enumerate(batch.non_tensor_batch["uid"]):
        rows_of.setdefault(uid, []).append(i)
    groups = list(rows_of.values())
    if len({len(g) for g in groups}) != 1 or len(groups) % world_size:
        return None
    return groups


def sequence_scores(batch: DataProto) -> torch.Tensor:
    """Each row's total score, (batch,)."""
    return batch.batch["token_level_scores"].sum(dim=-1)


def keep_varied_groups(batch: DataProto, metric: str | None) -> tuple[DataProto, int]:
    """DAPO dynamic sampling: keep only prompts whose samples do not all score the same.

    A group with identical scores has zero advantage under GRPO-style estimators and adds nothing but
    cost. `metric` names a per-sample value in non_tensor_batch (e.g. `acc`), or `seq_reward` /
    `seq_final_reward` (the sum of token scores / rewards), the default. Returns the kept rows and the
    number of prompts kept.
    """
    if metric in (None, "seq_final_reward", "seq_reward", "score"):
        key = "token_level_rewards" if metric == "seq_final_reward" and "token_level_rewards" in batch.batch \
            else "token_level_scores"
        values = batch.batch[key].sum(dim=-1).tolist()
    elif metric in batch.non_tensor_batch:
        values = [float(v) for v in batch.non_tensor_batch[metric]]
    else:
        raise KeyError(
            f"algorithm.filter_groups.metric={metric!r} is neither seq_reward/seq_final_reward nor a value "
            f"the reward function returns; returned values: {sorted(batch.non_tensor_batch)}"
        )
    by_uid: dict[str, list[float]] = {}
    for uid, value in zip(batch.non_tensor_batch["uid"], values, strict=True):
        by_uid.setdefault(uid, []).append(value)
    varied = {uid for uid, group in by_uid.items() if len(group) > 1 and float(np.std(group)) > 0}
    rows = [i for i, uid in enumerate(batch.non_tensor_batch["uid"]) if uid in varied]
    return batch.select_rows(rows), len(varied)
