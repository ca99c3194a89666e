"""Typed settings of the workers under verl's key names (`actor_rollout_ref.*`, `critic.*`,
`reward_model.model.*`): the one home of their defaults. A worker takes a dataclass or an OmegaConf node of
the same shape (`to_dataclass`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridrl.utils.typed_config import ConfigError, FreezableConfig, to_dataclass  # noqa: F401 - to_dataclass: re-exported for the workers


def _check_sampling(where: str, temperature: float, top_k: int, top_p: float, n: int) -> None:
    """Raise on values no sampler can use, naming the config key and the valid range."""
    if temperature < 0:
        raise ValueError(f"{where}.temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k < -1:
        raise ValueError(f"{where}.top_k must be -1 or 0 (off) or a positive count, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{where}.top_p must be in (0, 1] (1 means off), got {top_p}")
    if n < 1:
        raise ValueError(f"{where}.n must be >= 1 samples per prompt, got {n}")


@dataclass
class ValKwargs(FreezableConfig):
    """Sampling used when a call's meta_info has `validate=True` (verl's `rollout.val_kwargs`)."""

    # -1 (or 0) turns top-k filtering off
    top_k: int = -1
    # 1.0 turns nucleus filtering off
    top_p: float = 1.0
    # 0 means greedy decoding
    temperature: float = 0.0
    # samples per validation prompt
    n: int = 1
    # False decodes greedily whatever the temperature
    do_sample: bool = False

    def __post_init__(self) -> None:
        _check_sampling("rollout.val_kwargs", self.temperature, self.top_k, self.top_p, self.n)


AGENT_LOOPS = ("tool_agent", "single_turn_agent")


@dataclass
class MultiTurnConfig(FreezableConfig):
    """`rollout.multi_turn.*` (verl's keys): the agent loop (hybridrl/workers/rollout/agent_loop.py). Responses
    hold every turn within `rollout.response_length` tokens; `response_mask` is 1 on the model's tokens only."""

    # run the agent loop (generate, parse tool calls, run the tools, continue) instead of one turn
    enable: bool = False
    # most assistant turns per trajectory; null: only the response length limits them
    max_assistant_turns: int | None = None
    # most tool-response turns per trajectory; null: only the response length limits them
    max_user_turns: int | None = None
    # verl's tool YAML (`tools: - class_name, config, tool_schema`)
    tool_config_path: str | None = None
    # a Python file of @function_tool functions (hybridrl.tools.base_tool.function_tool)
    function_tool_path: str | None = None
    # tool calls run per assistant turn; later calls in the same turn are answered with an error
    max_parallel_calls: int = 1
    # characters of a tool response the model sees; the rest is cut
    max_tool_response_length: int = 256
    # which part of a longer tool response is kept: left (the start), right (the end), middle (both ends)
    tool_response_truncate_side: str = "middle"
    # how the model writes tool calls: hermes, <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    format: str = "hermes"
    # seconds each tool call (create, execute, calc_reward, release) may take (hybridrl's key)
    tool_timeout: float = 30.0
    # turn-by-turn token ids against the conversation tokenised at once: strict, ignore_strippable (whitespace
    # differences pass) or disable; mismatches count in agent/tokenization_mismatch
    tokenization_sanity_check_mode: str = "strict"
    # verl's interaction YAML: simulated users answering turns without a tool call (hybridrl/tools/interaction.py)
    interaction_config_path: str | None = None
    # verl's inference-only chat template and repeated multi-turn rollouts: only their off values run
    use_inference_chat_template: bool = False
    num_repeat_rollouts: int | None = None

    def __post_init__(self) -> None:
        where = "actor_rollout_ref.rollout.multi_turn"
        for name, choices in (("tokenization_sanity_check_mode", ("strict", "ignore_strippable", "disable")),
                              ("tool_response_truncate_side", ("left", "right", "middle")), ("format", ("hermes",))):
            if getattr(self, name) not in choices:
                raise ValueError(f"{where}.{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("max_assistant_turns", "max_user_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{where}.{name} must be null or >= 1, got {value}")
        for name in ("max_parallel_calls", "max_tool_response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_timeout <= 0:
            raise ValueError(f"{where}.tool_timeout must be > 0 seconds, got {self.tool_timeout}")


@dataclass
class AgentConfig(FreezableConfig):
    """`rollout.agent.*` (verl's keys): which agent loop a prompt row without `agent_name` gets."""

    # tool_agent or single_turn_agent; null: tool_agent when multi_turn.enable is set, else single_turn_agent
    default_agent_loop: str | None = None
    # verl's file of custom agent loop classes; only null is accepted (config_rules.UNSUPPORTED)
    agent_loop_config_path: str | None = None

    def __post_init__(self) -> None:
        if self.default_agent_loop is not None and self.default_agent_loop not in AGENT_LOOPS:
            raise ValueError(f"actor_rollout_ref.rollout.agent.default_agent_loop must be null or one of "
                             f"{AGENT_LOOPS}, got {self.default_agent_loop!r}")


@dataclass
class EngineKwargs(FreezableConfig):
    # Extra keyword arguments of each engine's constructor: `vllm` reaches vllm.LLM; the others warn.
    vllm: dict[str, Any] = field(default_factory=dict)
    sglang: dict[str, Any] = field(default_factory=dict)
    trtllm: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckpointEngineConfig(FreezableConfig):
    # verl's transport of weights into the rollout: no effect colocated (a warning names them); with a
    # rollout pool of its own (hybrid_engine=false) the bucket size is the largest message of a weight sync.
    backend: str = "naive"
    update_weights_bucket_megabytes: int = 2048
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProfilerConfig(FreezableConfig):
    # verl's per-role profiler: not implemented (a warning names it); use benchmarks/profile_step.py.
    tool: str | None = None
    enable: bool = False
    all_ranks: bool = False
    ranks: list[int] = field(default_factory=list)
    save_path: str | None = None
    tool_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutConfig(FreezableConfig):
    """`actor_rollout_ref.rollout.*`: which engine generates, and how it samples."""

    # engine registered in hybridrl.workers.rollout.ROLLOUT_ENGINES: "hf" (CPU/GPU) or "vllm" (optional)
    name: str = "hf"
    # softmax temperature; 0 means greedy
    temperature: float = 1.0
    # keep only the k most likely tokens; -1 (or 0) is off
    top_k: int = -1
    # keep the smallest set of tokens whose probability reaches top_p; 1.0 is off
    top_p: float = 1.0
    # prompts are left-padded to this length by the dataset (data.max_prompt_length)
    prompt_length: int = 512
    # responses are generated up to, and right-padded to, exactly this many tokens
    response_length: int = 512
    # samples per prompt (GRPO/RLOO group size)
    n: int = 1
    # False decodes greedily
    do_sample: bool = True
    # compute dtype of generation: float32 | bfloat16 | auto (bf16 on a GPU with native bf16, else fp32)
    dtype: str = "auto"
    # seed of the sampler's torch.Generator (the worker adds its rank); same seed, same samples
    seed: int = 0
    # keep generating past EOS (stop_token_ids still stop)
    ignore_eos: bool = False
    # extra token ids that end a response, on top of the tokenizer's/generation config's EOS ids
    stop_token_ids: list[int] | None = None
    # sampling for validation calls (meta_info validate=True)
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    # multi-turn generation with tools (the agent loop); off by default
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    # which loop rows without agent_name run (verl's rollout.agent)
    agent: AgentConfig = field(default_factory=AgentConfig)
    # micro-batch rows / dynamic batching for the actor's log-prob recomputation (read by the worker)
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    # report rollout/log_prob_diff_* (rollout against recomputed log-probs: catches stale rollout weights)
    calculate_log_probs: bool = True
    # vLLM only: memory share of the KV cache, tensor parallel size
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    # false: CUDA graphs for decoding, vLLM's and, on a GPU, the hf engine's
    # (hybridrl/workers/rollout/static_decode.py). null: graphs for hf on a GPU, eager for vLLM
    enforce_eager: bool | None = None
    # vLLM only: sleep between phases
    free_cache_engine: bool = True
    # verl's sync | async: both generate each batch whole inside the workers (async warns so).
    mode: str = "sync"
    # vLLM's scheduler and loader settings, passed to vllm.LLM (hybridrl/workers/rollout/vllm.py); the hf
    # engine warns about those set. max_model_len null: prompt + response length.
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    disable_log_stats: bool = True
    cudagraph_capture_sizes: list[int] | None = None
    engine_kwargs: EngineKwargs = field(default_factory=EngineKwargs)
    # verl's older global micro-batch size of the log-prob pass; divided by the world size if per-GPU is unset.
    log_prob_micro_batch_size: int | None = None
    # vLLM data / expert / pipeline parallelism inside the rollout: only 1 runs (config_rules.UNSUPPORTED).
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    # verl's SGLang staging, LoRA gathering, over-sampling, tracing and metrics server: no effect (warned).
    multi_stage_wake_up: bool = False
    layered_summon: bool = False
    over_sample_rate: float = 0.0
    skip_tokenizer_init: bool = False
    trace: dict[str, Any] = field(default_factory=dict)
    prometheus: dict[str, Any] = field(default_factory=dict)
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)

    def __post_init__(self) -> None:
        for name, cls in (("val_kwargs", ValKwargs), ("multi_turn", MultiTurnConfig), ("agent", AgentConfig),
                          ("engine_kwargs", EngineKwargs), ("checkpoint_engine", CheckpointEngineConfig)):
            if isinstance(getattr(self, name), dict):  # direct construction with a plain dict
                setattr(self, name, cls(**getattr(self, name)))
        _check_sampling("rollout", self.temperature, self.top_k, self.top_p, self.n)
        for name in ("prompt_length", "response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class OptimConfig(FreezableConfig):
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
    # Follows trainer.total_training_steps (leave it unset); cosine and lr_warmup_steps_ratio need it.
    total_training_steps: int = -1
    # verl's name for the role's grad_clip (actor.grad_clip, critic.grad_clip); null leaves grad_clip as set.
    clip_grad: float | None = None
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8


@dataclass
class MixedPrecisionConfig(FreezableConfig):
    # Compute dtype of forward/backward: float32 | bfloat16 | auto (bf16 on a GPU with native bf16, else fp32).
    param_dtype: str = "auto"
    # dtype of the gradient reduce-scatter across ranks.
    reduce_dtype: str = "float32"
    # dtype of the model's floating buffers (e.g. rotary frequencies), verl's FSDP1 key; null: as loaded.
    buffer_dtype: str | None = None


@dataclass
class FSDPConfig(FreezableConfig):
    # The actor's only: move to CPU memory while the rollout generates (param_offload: with rollout.name=vllm).
    param_offload: bool = False
    optimizer_offload: bool = False
    # Free gathered parameters after each layer's forward (saves memory, costs an all-gather in backward).
    reshard_after_forward: bool = True
    # Ranks that shard one model; -1: all. A divisor of the world size: hybrid sharding (a copy per group).
    fsdp_size: int = -1
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class RoleFSDPConfig(FSDPConfig):
    """A PPO role's FSDP settings: FSDPConfig plus verl's engine keys."""

    # fsdp | fsdp2 (both run FSDP2 here), as the role's own strategy key.
    strategy: str = "fsdp"
    # verl's FSDP1 prefetch switch: FSDP2 here prefetches the next layer's all-gather by itself.
    forward_prefetch: bool = False
    # dtype of the loaded, sharded weights and so of the optimizer state: fp32 or bf16 (updates round to bf16).
    model_dtype: str = "fp32"
    # verl's engine-level name for the role's ulysses_sequence_parallel_size; where both are set they must agree.
    ulysses_sequence_parallel_size: int = 1


@dataclass
class ModelConfig(FreezableConfig):
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
    # Runs the same either way: the actor always trims padding columns per micro-batch instead.
    use_remove_padding: bool = False
    # hybridrl's key: compute a prompt shared by several rows (a group's responses) once: same results.
    share_prompt_forward: bool = True
    # verl's GPU speed-ups that change no result: no effect here (a warning names them when set).
    use_shm: bool = False
    use_fused_kernels: bool = False
    fused_kernel_options: dict[str, Any] = field(default_factory=lambda: {"impl_backend": "torch"})
    use_liger: bool = False
    enable_activation_offload: bool = False
    # LoRA adapters on the actor (docs/lora.md): rank (0 = off), alpha (scale alpha / rank), the linears to
    # adapt ("all-linear", names or a regex) and to leave out, a PEFT adapter directory to start from (its
    # rank, alpha and targets win). critic.model: 0 only.
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    lora_adapter_path: str | None = None


@dataclass
class RewardModelModelConfig(FreezableConfig):
    # The actor's tokenizer, if it differs from the reward model's (rows are then re-templated); None: same.
    input_tokenizer: str | None = None
    # Local Hugging Face directory of the reward model (a token- or sequence-classification checkpoint).
    path: str | None = None
    # A module to import before loading (registers custom architectures), as in verl.
    external_lib: str | None = None
    trust_remote_code: bool = False
    # Values that replace entries of the checkpoint's config.json.
    override_config: dict[str, Any] = field(default_factory=dict)
    # Runs the same either way: each micro-batch is trimmed of padding columns instead.
    use_remove_padding: bool = False
    fsdp_config: RoleFSDPConfig = field(default_factory=RoleFSDPConfig)


@dataclass
class PolicyLossConfig(FreezableConfig):
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
class CheckpointConfig(FreezableConfig):
    # What a checkpoint holds and what a resume restores: model, optimizer, extra (RNG, scheduler), hf_model.
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    # None restores what save_contents lists.
    load_contents: list[str] | None = None


@dataclass
class ActorConfig(FreezableConfig):
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
    # optimal_token_baseline estimators need (hybridrl/algos/advantage.py).
    calculate_sum_pi_squared: bool = False
    # KL to the reference policy as a loss term (GRPO) rather than in the reward.
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    ppo_epochs: int = 1
    # hybridrl's key: on a fully on-policy step take the old log-probs from the update's own forward pass
    # instead of a separate one; `actor/old_log_prob_fused` says which path ran.
    fuse_old_log_prob: bool = True
    # Shuffle rows before cutting mini-batches (each epoch), seeded by data_loader_seed.
    shuffle: bool = False
    data_loader_seed: int | None = None
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: RoleFSDPConfig = field(default_factory=RoleFSDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # Ulysses sequence parallelism (docs/sequence-parallel.md): groups of this many ranks split each
    # sequence's tokens; must divide the actor's ranks.
    ulysses_sequence_parallel_size: int = 1
    # torch.compile: only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    use_torch_compile: bool = False
    # Not a setting: the actor fills it per mini-batch with the totals the policy loss normalises by.
    global_batch_info: dict[str, Any] = field(default_factory=dict)
    # verl's memory savers for the entropy of the logits: no effect here (config_rules.NO_EFFECT).
    entropy_checkpointing: bool = False
    entropy_from_logits_with_chunking: bool = False
    # verl's shared-prompt forward: model.share_prompt_forward does it here (config_rules.SAME_EITHER_WAY).
    use_prefix_grouper: bool = False
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


@dataclass
class RefConfig(FreezableConfig):
    # fsdp | fsdp2 (both run FSDP2 here).
    strategy: str = "fsdp"
    fsdp_config: RoleFSDPConfig = field(default_factory=RoleFSDPConfig)
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_micro_batch_size: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    # The reference's sequence-parallel size; null: the actor's (as in verl).
    ulysses_sequence_parallel_size: int | None = None
    # torch.compile: only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    use_torch_compile: bool = False
    entropy_checkpointing: bool = False
    entropy_from_logits_with_chunking: bool = False
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


@dataclass
class ActorRolloutRefConfig(FreezableConfig):
    """`actor_rollout_ref.*`: one model path shared by the actor, the rollout and the reference policy."""

    # True: actor, rollout and reference share one pool and the rollout generates with the actor's weights
    # in place. False: the rollout runs on a pool of its own, sent the weights after each update
    # (docs/placement.md).
    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # Seconds a collective of the workers' process group may wait before it fails (verl's key).
    nccl_timeout: int = 600


@dataclass
class CriticModelConfig(ModelConfig):
    fsdp_config: RoleFSDPConfig = field(default_factory=RoleFSDPConfig)


@dataclass
class CriticConfig(FreezableConfig):
    """`critic.*`: the value model for GAE (PPO)."""

    # fsdp | fsdp2 (both run FSDP2 here).
    strategy: str = "fsdp"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    # Samples per prompt. None follows actor_rollout_ref.rollout.n (a critic worker built on its own needs
    # it set); another value must equal it.
    rollout_n: int | None = None
    # Prompts per optimizer step (each with rollout_n responses), summed over data-parallel ranks.
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size_per_gpu: int | None = None
    ppo_micro_batch_size: int | None = None
    # The value pass's micro-batch; unset (both), it follows ppo_micro_batch_size(_per_gpu), as in verl.
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
    # Seconds a collective of a critic worker's process group may wait before it fails (verl reads the key
    # with this default).
    nccl_timeout: int = 600
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # The critic's sequence-parallel size, as the actor's.
    ulysses_sequence_parallel_size: int = 1
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


def _sequence_parallel_size(section: str, size: int | None, fsdp_size: int, inherited: int = 1) -> int:
    """A role's Ulysses group size from verl's two keys, `{section}.ulysses_sequence_parallel_size` (None:
    `inherited`) and its `fsdp_config.ulysses_sequence_parallel_size`; where both are set they must agree."""
    key = f"{section}.ulysses_sequence_parallel_size"
    fsdp_key = f"{'critic.model' if section == 'critic' else section}.fsdp_config.ulysses_sequence_parallel_size"
    size = inherited if size is None else size
    for name, value in ((key, size), (fsdp_key, fsdp_size)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if size != 1 and fsdp_size != 1 and size != fsdp_size:
        raise ConfigError(f"{key}={size} and {fsdp_key}={fsdp_size} disagree; set one of them")
    return fsdp_size if fsdp_size != 1 else size


def actor_sequence_parallel(config: ActorRolloutRefConfig) -> tuple[int, int]:
    """(actor's, reference's) Ulysses group sizes; the reference follows the actor unless set."""
    actor = _sequence_parallel_size("actor_rollout_ref.actor", config.actor.ulysses_sequence_parallel_size,
                                    config.actor.fsdp_config.ulysses_sequence_parallel_size)
    ref = _sequence_parallel_size("actor_rollout_ref.ref", config.ref.ulysses_sequence_parallel_size,
                                  config.ref.fsdp_config.ulysses_sequence_parallel_size, inherited=actor)
    return actor, ref


def critic_sequence_parallel(config: CriticConfig) -> int:
    return _sequence_parallel_size("critic", config.ulysses_sequence_parallel_size,
                                   config.model.fsdp_config.ulysses_sequence_parallel_size)
