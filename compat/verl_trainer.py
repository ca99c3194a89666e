"""verl's trainer-level names over hybridrl's trainer, for code and tests written against verl
(compat/verl_shim.py maps `verl.trainer.ppo.ray_trainer`, `verl.trainer.ppo.v1.utils` and
`verl.trainer.config.algorithm` here).

`compute_advantage` with verl's signature (the settings as arguments), its multi-output session variant,
`ResourcePoolManager` (roles mapped to named Ray resource pools), and `RolloutCorrectionConfig` with verl's
presets as classmethods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridrl import protocol as core
from hybridrl.algos import AdvantageEstimator
from hybridrl.protocol import DataProtoError
from hybridrl.trainer import dataflow, ppo_config
from hybridrl.trainer.ppo_config import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, PFPPOConfig

__all__ = ["AlgoConfig", "AlgorithmConfig", "FilterGroupsConfig", "KLControlConfig", "PFPPOConfig",
           "ResourcePoolManager", "RolloutCorrectionConfig", "compute_advantage",
           "compute_advantage_for_multi_trajectories"]

AlgoConfig = AlgorithmConfig  # verl's name


@dataclass
class RolloutCorrectionConfig(ppo_config.RolloutCorrectionConfig):
    """`algorithm.rollout_correction` with verl's presets, under its names and defaults. "geo" rejects a
    sequence on its geometric-mean ratio (seq_mean_k1, bounds around 1), "k3" on its mean k3 divergence
    (seq_mean_k3, an upper bound)."""

    @classmethod
    def decoupled_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        """Token IS weights kept inside [threshold_lower, threshold] and zeroed outside; no rejection."""
        return cls(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}", rollout_rs=None)

    @classmethod
    def decoupled_geo_rs_seq_tis(cls, is_threshold: float = 2.0,
                                 rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Sequence IS weights truncated at is_threshold, and sequences rejected on their geometric-mean
        ratio (seq_mean_k1) outside rs_threshold."""
        return cls(rollout_is="sequence", rollout_is_threshold=is_threshold, rollout_rs="seq_mean_k1",
                   rollout_rs_threshold=rs_threshold)

    @classmethod
    def bypass_ppo_clip(cls) -> RolloutCorrectionConfig:
        """No old log-prob pass: PPO clips pi_theta / pi_rollout directly; no weights, no rejection."""
        return cls(bypass_mode=True, loss_type="ppo_clip")

    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Token IS weights truncated at `threshold`."""
        return cls(rollout_is="token", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Sequence IS weights truncated at `threshold`."""
        return cls(rollout_is="sequence", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_seq_is_rs(cls, is_threshold: float = 2.0,
                            rs_threshold: str | float = "0.5_2.0") -> RolloutCorrectionConfig:
        """Sequence IS weights, and sequences rejected on their whole ratio (seq_sum_k1) outside rs_threshold."""
        return cls(rollout_is="sequence", rollout_is_threshold=is_threshold, rollout_rs="seq_sum_k1",
                   rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Geometric-mean rejection only."""
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_geo_rs_token_tis(cls, is_threshold: float = 2.0,
                                   rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Geometric-mean rejection and token IS weights."""
        return cls(rollout_is="token", rollout_is_threshold=is_threshold, rollout_rs="seq_mean_k1",
                   rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """Mean-k3 rejection only."""
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """Mean-k3 rejection and sequence IS weights."""
        return cls(rollout_is="sequence", rollout_is_threshold=is_threshold, rollout_rs="seq_mean_k3",
                   rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs_token_tis(cls, is_threshold: float = 2.0,
                                  rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """Mean-k3 rejection and token IS weights."""
        return cls(rollout_is="token", rollout_is_threshold=is_threshold, rollout_rs="seq_mean_k3",
                   rollout_rs_threshold=rs_threshold)

    @classmethod
    def bypass_ppo_clip_geo_rs(cls, rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Bypass mode, PPO's clip on pi_theta / pi_rollout, geometric-mean rejection in the loss."""
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True)

    @classmethod
    def bypass_ppo_clip_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """Bypass mode, PPO's clip, mean-k3 rejection in the loss."""
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold, bypass_mode=True)

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE weighted by sequence IS weights truncated at `threshold`."""
        return cls(rollout_is="sequence", rollout_is_threshold=threshold, bypass_mode=True, loss_type="reinforce")

    @classmethod
    def bypass_pg_geo_rs(cls, rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE with geometric-mean rejection and no weights."""
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True,
                   loss_type="reinforce")

    @classmethod
    def bypass_pg_geo_rs_seq_tis(cls, is_threshold: float = 2.0,
                                 rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE with geometric-mean rejection and sequence IS weights."""
        return cls(rollout_is="sequence", rollout_is_threshold=is_threshold, rollout_rs="seq_mean_k1",
                   rollout_rs_threshold=rs_threshold, bypass_mode=True, loss_type="reinforce")

    @classmethod
    def bypass_pg_geo_rs_token_tis(cls, is_threshold: float = 2.0,
                                   rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE with geometric-mean rejection and token IS weights."""
        return cls(rollout_is="token", rollout_is_threshold=is_threshold, rollout_rs="seq_mean_k1",
                   rollout_rs_threshold=rs_threshold, bypass_mode=True, loss_type="reinforce")

    @classmethod
    def disabled(cls) -> RolloutCorrectionConfig:
        """No correction (the rollout-vs-trainer metrics still come with the old log-prob pass)."""
        return cls()


def compute_advantage(
    data: core.DataProto,
    adv_estimator: str | AdvantageEstimator,
    gamma: float | None = None,
    lam: float | None = None,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
) -> core.DataProto:
    """verl's trainer-level call: gamma, lam and norm_adv_by_std_in_grpo as arguments (default 1.0, 1.0,
    True) or from `config`, the algorithm config; one given both ways with different values raises.
    `num_repeat` is accepted and unused, as in verl."""
    explicit = {"gamma": gamma, "lam": lam, "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo}
    if config is None:
        defaults = {"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True}
        config = AlgorithmConfig(**{name: defaults[name] if value is None else value
                                    for name, value in explicit.items()})
    for name, value in explicit.items():
        if value is not None and value != getattr(config, name):
            raise ValueError(f"compute_advantage: {name}={value!r} was passed but config.{name} is "
                             f"{getattr(config, name)!r}")
    return dataflow.compute_advantage(data, adv_estimator, config)


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
    """Advantages when an agent session returns several rows and only its last is scored (verl's v1 utility).

    For GRPO the group is formed by each session's final row (`batch_keys`: "{uid}_{session_id}_{output_index}"
    per row), and its advantage at the first response token goes to every row of the session; other
    estimators see the rows as they are, as in verl. Writes into and returns `data`.
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


def _final_rows(batch_keys: list[str]) -> tuple[list[int], list[int]]:
    """For keys "{uid}_{session}_{output}": the row of each session's last output, and for every row its
    session's index in that list."""
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


@dataclass
class ResourcePoolManager:
    """Maps roles to named resource pools: `{"global_pool": [2]}` and `{Role.ActorRollout: "global_pool"}`."""

    resource_pool_spec: Mapping[str, list[int]]
    mapping: Mapping[object, str]
    use_gpu: bool = False
    max_colocate_count: int = 1
    cpus_per_process: float = 1.0

    def __post_init__(self) -> None:
        unknown = {role: pool for role, pool in self.mapping.items() if pool not in self.resource_pool_spec}
        if unknown:
            raise ValueError(f"roles mapped to undefined pools: {unknown}; pools: {list(self.resource_pool_spec)}")
        self.resource_pools: dict[str, Any] = {}

    def create_resource_pool(self) -> None:
        from hybridrl.controller.ray import RayResourcePool  # imports Ray, which only this method needs

        for name, process_on_nodes in self.resource_pool_spec.items():
            pool = RayResourcePool(process_on_nodes, self.use_gpu, self.max_colocate_count,
                                   self.cpus_per_process, name_prefix=name)
            pool.get_placement_groups()
            self.resource_pools[name] = pool

    def get_resource_pool(self, role: object) -> Any:
        if role not in self.mapping:
            raise KeyError(f"role {role!r} is not mapped to a resource pool; mapped roles: {list(self.mapping)}")
        return self.resource_pools[self.mapping[role]]

    def get_n_processes(self) -> int:
        return sum(sum(nodes) for nodes in self.resource_pool_spec.values())
