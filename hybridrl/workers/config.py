"""Typed settings of the workers, under verl's key names (`actor_rollout_ref.*`, `critic.*`).

These dataclasses are the one home of the workers' defaults. The Hydra config composes them; every
worker receives either a dataclass or an OmegaConf node of the same shape (`to_dataclass` converts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridrl.utils.typed_config import to_dataclass  # noqa: F401 - re-exported for the workers
from hybridrl.workers.rollout.rollout_config import RolloutConfig


@dataclass
class OptimConfig:
    # Peak learning rate of AdamW.
    lr: float = 1e-6
    # Warmup steps; -1 derives them from lr_warmup_steps_ratio x total_training_steps.
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    # After warmup: "constant" or "cosine" (decays to min_lr_ratio x lr over the remaining steps).
    warmup_style: str = "constant"
    min_lr_ratio: float = 0.0
    # Cosine cycles over the decay phase; 0.5 is one half-cosine from lr down to the floor.
    num_cycles: float = 0.5
    # Filled in by the trainer from the data size and epochs; the cosine schedule needs it.
    total_training_steps: int = -1
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8


@dataclass
class MixedPrecisionConfig:
    # Compute dtype of forward/backward: float32 | bfloat16 | auto (bf16 where the device multiplies it
    # natively: AMX or AVX512_BF16 CPUs, bf16 GPUs; fp32 elsewhere) | null, the default: the device's
    # (bf16 on a bf16 GPU, as verl; fp32 on a CPU). The sharded master weights and the optimizer state
    # stay in the loaded dtype (fp32).
    param_dtype: str | None = None
    # dtype of the gradient reduce-scatter across ranks.
    reduce_dtype: str = "float32"


@dataclass
class FSDPConfig:
    # The actor's only (actor_rollout_ref.actor.fsdp_config): its optimizer state / parameters move to CPU
    # memory while the rollout generates (the hand-off, BaseRollout.serving; param_offload needs an engine
    # with its own weights, rollout.name=vllm). No-ops on CPU. Other models refuse true.
    param_offload: bool = False
    optimizer_offload: bool = False
    # Free gathered parameters after each layer's forward (saves memory, costs an all-gather in backward).
    reshard_after_forward: bool = True
    # Ranks that shard one model; -1 means all ranks of the group.
    fsdp_size: int = -1
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class ModelConfig:
    # Local Hugging Face checkpoint directory (or a repo id already in the local cache).
    path: str = "???"
    # Tokenizer directory when it differs from `path`.
    tokenizer_path: str | None = None
    # Values that replace entries of the checkpoint's config.json (e.g. {attn_implementation: eager}).
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    # A module to import before loading (registers custom architectures), as in verl.
    external_lib: str | None = None
    # Runs the same either way (hybridrl/trainer/config_rules.py): padding-free kernels need
    # flash-attention (GPU); the actor always trims padding columns per micro-batch instead.
    use_remove_padding: bool = False
    # hybridrl's key: the passes of this model (actor_rollout_ref.model: the actor's and the reference's;
    # critic.model: the critic's) compute a prompt shared by several rows (the rollout.n responses of a
    # group) once, and every response attends to it (hybridrl/models/shared_prompt.py): the same
    # log-probs / values and gradients from fewer tokens.
    share_prompt_forward: bool = True


@dataclass
class PolicyLossConfig:
    # Registered policy loss: vanilla | gspo | gpg | clip_cov | kl_cov | dro | importance_sampling | up |
    # cispo | sapo | dppo_tv | dppo_kl | geo_mean | topr (or one you register; hybridrl/algos/policy_loss*.py).
    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    # Strength of dro's quadratic log-ratio penalty; the dro loss requires it to be > 0.
    dro_beta: float | None = None
    # topr: the range a negative-advantage sequence's ratio is clipped to (its weight; positive ones get 1).
    topr_negative_ratio_lower: float = 0.0
    topr_negative_ratio_upper: float = 1.0


@dataclass
class CheckpointConfig:
    # What a checkpoint holds and what a resume restores: model, optimizer, extra (RNG, scheduler), hf_model.
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    # None restores what save_contents lists.
    load_contents: list[str] | None = None


@dataclass
class ActorConfig:
    # fsdp | fsdp2 (both run FSDP2 here).
    strategy: str = "fsdp"
    # Prompts per optimizer step (each with rollout.n responses), summed over data-parallel ranks.
    ppo_mini_batch_size: int = 256
    # verl's copy of rollout.n on the actor; None follows rollout.n, another value must equal it.
    rollout_n: int | None = None
    # Rows per forward/backward on one rank; gradients accumulate over the micro-batches.
    ppo_micro_batch_size_per_gpu: int | None = None
    # verl's older global micro-batch size; divided by the world size when the per-GPU value is unset.
    ppo_micro_batch_size: int | None = None
    # Cut micro-batches by a token budget (rows x padded width) instead of a row count.
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    grad_clip: float = 1.0
    # PPO clip range; clip_ratio_low / clip_ratio_high override it per side (DAPO clip-higher).
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    # Dual-clip bound for negative advantages (Ye et al. 2020); dppo_tv / dppo_kl truncate the ratio at it.
    clip_ratio_c: float = 3.0
    # sapo's gate temperatures for positive / negative advantages (the paper's 1.0 / 1.05).
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    # token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    # The old log-prob pass also returns sum_v pi_v^2 per response token (`sum_pi_squared`), which the
    # optimal_token_baseline estimators need (hybridrl/algos/optimal_baseline.py).
    calculate_sum_pi_squared: bool = False
    # KL to the reference policy as a loss term (GRPO) rather than in the reward.
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    ppo_epochs: int = 1
    # hybridrl's key: on a fully on-policy step (ppo_epochs=1, one mini-batch per step, nothing that reads
    # old log-probs before the update) take them from the update's own forward pass instead of a separate
    # one; `actor/old_log_prob_fused` says which path ran (`old_log_prob_blockers`, hybridrl/trainer/dataflow.py).
    fuse_old_log_prob: bool = True
    # Shuffle rows before cutting mini-batches (each epoch), seeded by data_loader_seed.
    shuffle: bool = False
    data_loader_seed: int | None = None
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # Sequence parallelism and torch.compile: only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    ulysses_sequence_parallel_size: int = 1
    use_torch_compile: bool = False


@dataclass
class RefConfig:
    # fsdp | fsdp2 (both run FSDP2 here).
    strategy: str = "fsdp"
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_micro_batch_size: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    # Sequence parallelism and torch.compile: only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    ulysses_sequence_parallel_size: int = 1
    use_torch_compile: bool = False


@dataclass
class ActorRolloutRefConfig:
    """`actor_rollout_ref.*`: one model path shared by the actor, the rollout and the reference policy."""

    # Actor and rollout share one process and one set of weights; only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class CriticModelConfig(ModelConfig):
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class CriticConfig:
    """`critic.*`: the value model for GAE (PPO)."""

    # fsdp | fsdp2 (both run FSDP2 here).
    strategy: str = "fsdp"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    # Samples per prompt, so mini-batch sizes in prompts convert to rows. None follows
    # actor_rollout_ref.rollout.n (the PPO trainer fills it in); another value must equal it. A critic
    # worker built on its own needs it set.
    rollout_n: int | None = None
    # Prompts per optimizer step (each with rollout_n responses), summed over data-parallel ranks.
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size_per_gpu: int | None = None
    ppo_micro_batch_size: int | None = None
    forward_micro_batch_size_per_gpu: int | None = None
    forward_micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int = 32768
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int | None = None
    grad_clip: float = 1.0
    # Value-loss clip range around the rollout-time values.
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # Only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    ulysses_sequence_parallel_size: int = 1
