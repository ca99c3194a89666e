"""The driver's stages of a PPO step that act on a whole batch (docs/architecture.md, "One PPO step"):
pure functions on DataProto, in the order of a step."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from hybridrl.algos import AdvantageEstimator, get_adv_estimator_spec
from hybridrl.algos import compute_advantage as run_estimator
from hybridrl.algos.rollout_correction import compute_rollout_correction
from hybridrl.data.seqlen_balancing import get_seqlen_balanced_partitions, log_seqlen_unbalance
from hybridrl.protocol import DataProto
from hybridrl.rewards.managers import REWARD_MANAGERS, RewardManager, get_custom_reward_fn
from hybridrl.rewards.scorers import default_compute_score
from hybridrl.trainer.ppo_config import (
    ROLLOUT_CORRECTION_KEY,
    AlgorithmConfig,
    DataConfig,
    PPOTrainerConfig,
    RolloutCorrectionConfig,
)
from hybridrl.utils.typed_config import require_config_object, to_dataclass
from hybridrl.workers.reward_model import RewardModelConfig

__all__ = ["BackgroundReward", "load_reward_manager"]


# Here, not in hybridrl.rewards.managers: it reads the trainer's schema, and the reward model's config imports them
def load_reward_manager(config: Mapping[str, Any], tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> RewardManager:
    """The manager named by `config.reward_model.reward_manager` (verl's `load_reward_manager`); `config` is a
    plain mapping (missing keys take the schema's defaults), the scorer `custom_reward_function.*` or the default."""
    reward_model = to_dataclass(RewardModelConfig, config.get("reward_model") or {})
    data = config.get("data") or {}
    cls = REWARD_MANAGERS.get(reward_model.reward_manager)
    max_response_length = data.get("max_response_length", DataConfig.max_response_length)
    manager_kwargs = {**cls.config_kwargs(reward_model, max_response_length), **reward_model.reward_kwargs,
                      **kwargs}
    compute_score = get_custom_reward_fn(config) or functools.partial(
        default_compute_score, sandbox_limits=reward_model.sandbox.limits())
    return cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score,
               reward_fn_key=data.get("reward_fn_key", DataConfig.reward_fn_key), **manager_kwargs)


RewardFn = Callable[..., dict[str, Any]]


class BackgroundReward:
    """One background thread that scores batches with `reward_fn(batch, return_dict=True)` while the driver
    drives the log-prob and value passes; it scores a shallow copy, since the trainer adds keys meanwhile."""

    def __init__(self, reward_fn: RewardFn) -> None:
        self.reward_fn = reward_fn
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridrl-reward")

    def submit(self, batch: DataProto) -> Future[dict[str, Any]]:
        """Start scoring `batch`; `.result()` returns the manager's dict or raises what it raised."""
        snapshot = batch.select(deepcopy=False)
        return self._executor.submit(self.reward_fn, snapshot, return_dict=True)

    def close(self) -> None:
        """Wait for a scoring in flight (bounded by reward_model.reward_fn_timeout) and stop the thread."""
        self._executor.shutdown(wait=True)


PROMPT_TENSORS = ["input_ids", "attention_mask", "position_ids"]


def new_prompt_batch(batch_dict: dict) -> DataProto:
    """A DataProto of prompts from the dataloader, each with a fresh `uid` (its GRPO group id)."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    return batch


def split_generation_input(batch: DataProto, columns: Sequence[str] = ()) -> DataProto:
    """Take the prompt tensors out of `batch` as the rollout's input, with the non-tensor `columns` it reads."""
    generation_input = batch.pop(batch_keys=PROMPT_TENSORS)
    generation_input.non_tensor_batch.update({key: batch.non_tensor_batch[key] for key in columns
                                              if key in batch.non_tensor_batch})
    return generation_input


def attach_responses(batch: DataProto, generated: DataProto) -> DataProto:
    """Repeat each prompt row once per sample (interleaved, as the rollout orders them) and merge."""
    n = len(generated) // len(batch)
    if n * len(batch) != len(generated):
        raise ValueError(f"the rollout returned {len(generated)} rows for {len(batch)} prompts")
    return batch.repeat(n, interleave=True).union(generated)


def balance_batch(batch: DataProto, world_size: int, keep_groups: bool = False) -> dict[str, float]:
    """Reorder rows so each data-parallel rank's contiguous chunk holds a similar number of tokens.
    `keep_groups`: a prompt's rows (one `uid`) go to one rank together, where the groups divide evenly."""
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
    """DAPO dynamic sampling: the rows of prompts whose samples differ on `metric` (a value the reward function
    returned, such as `acc` or `score`, or seq_reward / seq_final_reward: the token scores' / rewards' sums; a
    `score` the function did not return is seq_reward), and the number of prompts kept."""
    if metric in batch.non_tensor_batch and metric not in ("seq_final_reward", "seq_reward"):
        values = [float(v) for v in batch.non_tensor_batch[metric]]
    elif metric in (None, "seq_final_reward", "seq_reward", "score"):
        key = "token_level_rewards" if metric == "seq_final_reward" and "token_level_rewards" in batch.batch \
            else "token_level_scores"
        values = batch.batch[key].sum(dim=-1).tolist()
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


def old_log_prob_blockers(config: PPOTrainerConfig) -> list[str]:
    """Why this config needs the separate old log-prob pass, each naming its key; empty when the update can
    give them (a fully on-policy step: one epoch over one mini-batch, nothing reads them before)."""
    actor = config.actor_rollout_ref.actor
    reasons = []
    if not actor.fuse_old_log_prob:
        reasons.append("actor_rollout_ref.actor.fuse_old_log_prob=false")
    if actor.ppo_epochs != 1:
        reasons.append(f"actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs} (later epochs need the first's "
                       f"log-probs)")
    if actor.ppo_mini_batch_size != config.data.train_batch_size:
        reasons.append(f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < "
                       f"data.train_batch_size={config.data.train_batch_size} (later mini-batches see updated weights)")
    if config.algorithm.use_kl_in_reward:
        reasons.append("algorithm.use_kl_in_reward=true (the reward reads them before the update)")
    estimator = config.algorithm.adv_estimator
    if "old_log_probs" in get_adv_estimator_spec(estimator).required_inputs:
        reasons.append(f"algorithm.adv_estimator={estimator} (the advantages read them before the update)")
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode:
        reasons.append("algorithm.rollout_correction.bypass_mode=true (the rollout's log-probs serve instead)")
    elif correction.enabled:
        reasons.append("algorithm.rollout_correction.rollout_is/rollout_rs (the weights and the rejection mask "
                       "read them before the update)")
    return reasons


def rollout_log_probs(batch: DataProto, why: str) -> torch.Tensor:
    """The rollout engine's log-probs of the sampled tokens, (batch, response_len); a clear error without them."""
    if "rollout_log_probs" not in batch.batch:
        raise KeyError(
            f"{why} needs the batch column 'rollout_log_probs' (the rollout engine's log-prob of each sampled "
            f"token), which this rollout did not return; use a rollout engine that returns them (hf, vllm) or "
            f"set {ROLLOUT_CORRECTION_KEY}.rollout_is=null, rollout_rs=null and bypass_mode=false"
        )
    return batch.batch["rollout_log_probs"]


def correct_rollout(batch: DataProto, config: RolloutCorrectionConfig) -> dict[str, float]:
    """Decoupled mode, in place: `rollout_is_weights` (batch, response_len) when `config.rollout_is` is set, and
    `response_mask` less the rejected tokens. Returns the `rollout_corr/*` metrics."""
    where = f"{ROLLOUT_CORRECTION_KEY}.rollout_is / rollout_rs"
    weights, mask, metrics = compute_rollout_correction(
        batch.batch["old_log_probs"], rollout_log_probs(batch, where), batch.batch["response_mask"],
        rollout_is=config.rollout_is, rollout_is_threshold=config.rollout_is_threshold,
        rollout_is_batch_normalize=config.rollout_is_batch_normalize, rollout_rs=config.rollout_rs,
        rollout_rs_threshold=config.rollout_rs_threshold,
    )
    if weights is not None:
        batch.batch["rollout_is_weights"] = weights
    batch.batch["response_mask"] = mask
    return metrics


def bypass_old_log_probs(batch: DataProto) -> None:
    """Bypass mode, in place: `old_log_probs` are the rollout's, so the PPO ratio is pi_theta / pi_rollout."""
    batch.batch["old_log_probs"] = rollout_log_probs(batch, f"{ROLLOUT_CORRECTION_KEY}.bypass_mode=true").clone()


def bypass_metric_names(actor_metrics: dict[str, float]) -> dict[str, float]:
    """The actor's metrics with bypass mode's `actor/rollout_corr/*` under `rollout_corr/*` (token-weighted means
    over micro-batches, so a `_max` is the mean of their maxima)."""
    prefix = "actor/rollout_corr/"
    return {name.removeprefix("actor/") if name.startswith(prefix) else name: value
            for name, value in actor_metrics.items()}


def compute_advantage(data: DataProto, adv_estimator: str | AdvantageEstimator,
                      config: AlgorithmConfig) -> DataProto:
    """Set data.batch["advantages"] and ["returns"] (batch, response_len) from `adv_estimator`, given every
    input the batch has and `config` (algorithm.*); returns data."""
    require_config_object(config, "compute_advantage", "the algorithm config (algorithm.*)")
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
        gamma=config.gamma,
        lam=config.lam,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
    )
    batch["advantages"], batch["returns"] = advantages, returns
    return data
