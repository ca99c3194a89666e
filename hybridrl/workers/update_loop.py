"""The mini-batch / micro-batch update loop shared by the actor and the critic, and its batch-size checks.
A micro-batch's loss is normalised by its mini-batch's totals over all ranks (`global_batch_info`), so the
accumulated gradient is the whole mini-batch's whatever the micro-batch size or rank count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hybridrl.protocol import DataProto
from hybridrl.utils.cpu_threads import fit_cpu_threads
from hybridrl.utils.typed_config import ConfigError
from hybridrl.workers.config import (
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    RefConfig,
    RolloutConfig,
    actor_sequence_parallel,
    critic_sequence_parallel,
)
from hybridrl.workers.fsdp_engine import FSDPEngine
from hybridrl.workers.micro_batch import make_micro_batches, reduce_over_ranks
from hybridrl.workers.sequence_parallel import check_sequence_parallel


@dataclass
class BatchingPlan:
    """Rows per optimizer step and per forward pass on this rank (already divided by the world size)."""

    mini_batch_rows: int
    micro_batch_rows: int | None = None  # fixed micro-batches ...
    max_token_len: int | None = None  # ... or a token budget (dynamic batch size)
    epochs: int = 1
    shuffle: bool = False
    seed: int = 0


@dataclass
class MetricSums:
    """Per-mini-batch sums that become exact global means after one all-reduce: `add` accumulates a weighted
    value, `plain` a value already a share of the mini-batch (a loss under global normalisation)."""

    weighted: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    shares: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, name: str, value: float, weight: float) -> None:
        self.weighted[name][0] += value * weight
        self.weighted[name][1] += weight

    def plain(self, name: str, value: float) -> None:
        self.shares[name] += value

    def reduce(self, replicas: int = 1) -> dict[str, float]:
        """Global means; `replicas`: ranks holding each row (a sequence-parallel group), counted once."""
        names, shares = sorted(self.weighted), sorted(self.shares)
        flat = [v for n in names for v in self.weighted[n]] + [self.shares[n] for n in shares]
        totals, world = reduce_over_ranks(flat)
        sums = totals.tolist()
        out = {name: sums[2 * i] / sums[2 * i + 1] if sums[2 * i + 1] else 0.0 for i, name in enumerate(names)}
        # every rank's share was scaled by the world size (FSDP averages gradients): divide it back out
        out.update({name: sums[2 * len(names) + j] / world / replicas for j, name in enumerate(shares)})
        return out


MicroStep = Callable[[DataProto, dict, MetricSums], torch.Tensor]


def global_batch_info(mini_batch: DataProto, replicas: int = 1) -> dict:
    """Token and sequence totals of a mini-batch over all ranks (the normalisers of `agg_loss`); `replicas`
    ranks hold each row (a sequence-parallel group), which the totals count once."""
    mask = mini_batch.batch["response_mask"]
    totals, world = reduce_over_ranks([float(mask.sum()), float(len(mini_batch))])
    totals /= replicas
    return {"batch_num_tokens": totals[0].item(), "global_batch_size": totals[1].item(), "dp_size": world}


def run_updates(engine: FSDPEngine, data: DataProto, plan: BatchingPlan, micro_step: MicroStep,
                prefix: str, group_ids_of: Callable[[DataProto], torch.Tensor | None]) -> dict[str, list[float]]:
    """Run the epochs x mini-batches x micro-batches loop; return per-mini-batch metrics by name.
    micro_step(micro_batch, global_batch_info, sums) returns the micro-batch's loss share to back-propagate;
    group_ids_of(mini_batch) names rows to keep together."""
    if len(data) % plan.mini_batch_rows:
        raise ValueError(
            f"{len(data)} rows on this rank do not divide into mini-batches of {plan.mini_batch_rows}; "
            f"train_batch_size x rollout.n must be a multiple of ppo_mini_batch_size x rollout.n"
        )
    metrics: dict[str, list[float]] = defaultdict(list)
    # drawn on the CPU, so a seed gives the same order on CPU and GPU (row indices are CPU tensors anyway)
    generator = torch.Generator(device="cpu").manual_seed(plan.seed)
    for _ in range(plan.epochs):
        rows = data
        if plan.shuffle:
            rows = data.select_rows(torch.randperm(len(data), generator=generator, device="cpu"))
        for mini in rows.split(plan.mini_batch_rows):
            info = global_batch_info(mini, engine.sequence_parallel.size)
            sums = MetricSums()
            micro_batches = make_micro_batches(mini, plan.micro_batch_rows, plan.max_token_len, group_ids_of(mini))
            for i, micro in enumerate(micro_batches):
                fit_cpu_threads()
                with engine.gradient_sync(i == len(micro_batches) - 1):
                    micro_step(micro.data, info, sums).backward()
            step = engine.clip_and_step()
            for name, value in {**sums.reduce(engine.sequence_parallel.size), **step}.items():
                metrics[f"{prefix}/{name}"].append(value)
    engine.lr_scheduler_step()
    return dict(metrics)


def per_rank(total: int, world_size: int, what: str) -> int:
    if total % world_size:
        raise ConfigError(f"{what} ({total}) must be divisible by the data-parallel size ({world_size})")
    return total // world_size


def micro_batch_per_rank(per_gpu: int | None, global_size: int | None, world_size: int, key: str) -> int | None:
    """Rows per pass on one rank: `{key}_per_gpu`, else verl's older global `{key}` over the ranks, else None."""
    if per_gpu is not None:
        if per_gpu <= 0:
            raise ConfigError(f"{key}_per_gpu must be positive, got {per_gpu}")
        return per_gpu
    return None if global_size is None else per_rank(global_size, world_size, key)


def check_actor_rollout_ref(config: ActorRolloutRefConfig, world_size: int) -> None:
    """Raise, naming the key, unless the actor's, rollout's and reference's batch sizes cut a rank's rows."""
    n = config.rollout.n
    if config.actor.rollout_n not in (None, n):
        raise ConfigError(f"actor_rollout_ref.actor.rollout_n ({config.actor.rollout_n}) disagrees with "
                          f"actor_rollout_ref.rollout.n ({n}); leave actor.rollout_n unset, it follows rollout.n")
    update_plan(config.actor, n, world_size)
    log_prob_batching(config.rollout, world_size)
    log_prob_batching(config.ref, world_size)
    actor_sp, ref_sp = actor_sequence_parallel(config)
    check_sequence_parallel(actor_sp, world_size, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    check_sequence_parallel(ref_sp, world_size, "actor_rollout_ref.ref.ulysses_sequence_parallel_size")


def check_critic(config: CriticConfig, world_size: int) -> None:
    """As `check_actor_rollout_ref`, for the critic."""
    if config.rollout_n is None:
        raise ConfigError("critic.rollout_n is unset: set it to the samples per prompt (the PPO trainer fills it "
                          "in from actor_rollout_ref.rollout.n)")
    update_plan(config, config.rollout_n, world_size)
    value_batching(config, world_size)
    check_sequence_parallel(critic_sequence_parallel(config), world_size, "critic.ulysses_sequence_parallel_size")


def update_plan(config: ActorConfig | CriticConfig, rollout_n: int, world_size: int) -> BatchingPlan:
    """How an actor or critic config (verl's same update keys) cuts a rank's rows at this world size."""
    prefix = "critic" if isinstance(config, CriticConfig) else "actor_rollout_ref.actor"
    # rows one rank trains on per optimizer step
    rows = per_rank(config.ppo_mini_batch_size * rollout_n, world_size,
                    f"{prefix}.ppo_mini_batch_size ({config.ppo_mini_batch_size}) x rollout.n ({rollout_n})")
    micro = micro_batch_per_rank(config.ppo_micro_batch_size_per_gpu, config.ppo_micro_batch_size, world_size,
                                 f"{prefix}.ppo_micro_batch_size")
    return BatchingPlan(
        mini_batch_rows=rows,
        micro_batch_rows=None if config.use_dynamic_bsz else (micro or rows),
        max_token_len=config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None,
        epochs=config.ppo_epochs,
        shuffle=config.shuffle,
        seed=config.data_loader_seed or 0,
    )


def forward_batching(use_dynamic_bsz: bool, per_gpu: int | None, global_size: int | None, world_size: int,
                     key: str, max_token_len: int) -> tuple[int | None, int | None]:
    """(micro_batch_rows, max_token_len) of a no-grad pass whose micro-batch keys are `key[_per_gpu]`; without a
    micro-batch size, a rank's share at once."""
    micro_batch_rows = micro_batch_per_rank(per_gpu, global_size, world_size, key)
    if use_dynamic_bsz:
        return None, max_token_len
    return (None, 2**31) if micro_batch_rows is None else (micro_batch_rows, None)


def log_prob_batching(config: RolloutConfig | RefConfig, world_size: int) -> tuple[int | None, int | None]:
    """Forward batching of a rollout or ref config's log-prob keys."""
    section = "ref" if isinstance(config, RefConfig) else "rollout"
    return forward_batching(config.log_prob_use_dynamic_bsz, config.log_prob_micro_batch_size_per_gpu,
                            config.log_prob_micro_batch_size, world_size,
                            f"actor_rollout_ref.{section}.log_prob_micro_batch_size",
                            config.log_prob_max_token_len_per_gpu)


def value_batching(config: CriticConfig, world_size: int) -> tuple[int | None, int | None]:
    """Forward batching of the critic's value pass."""
    return forward_batching(config.use_dynamic_bsz, config.forward_micro_batch_size_per_gpu,
                            config.forward_micro_batch_size, world_size, "critic.forward_micro_batch_size",
                            config.forward_max_token_len_per_gpu)
