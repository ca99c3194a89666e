"""The rule of every PPO key on its own: the numeric range it must lie in, or the values hybridrl runs.

Each failure names the key, why, and a value that runs. Every numeric key is in `RANGES` or `UNCHECKED` (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from hybridrl.trainer.placement import actor_role_name, uses_critic, uses_reference
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.utils.typed_config import as_override, freeze
from hybridrl.workers.fsdp_engine import offload_refusals
from hybridrl.workers.fsdp_workers import actor_offload_refusals
from hybridrl.workers.reward_model import STRATEGIES


@dataclass(frozen=True)
class Rule:
    text: str  # the allowed values, as the error message states them
    ok: Callable[[Any], bool]


def at_least(low: float) -> Rule:
    return Rule(f">= {low}", lambda v: v >= low)


def above(low: float) -> Rule:
    return Rule(f"> {low}", lambda v: v > low)


def within(low: float, high: float) -> Rule:
    return Rule(f"in [{low}, {high}]", lambda v: low <= v <= high)


def optional(rule: Rule) -> Rule:
    return Rule(f"null or {rule.text}", lambda v: v is None or rule.ok(v))


COUNT = at_least(1)
OPTIONAL_COUNT = optional(at_least(1))  # unset (null) or a positive count
SHARE = Rule("in (0, 1]", lambda v: 0 < v <= 1)
BETAS = Rule("a list of two numbers in [0, 1) (AdamW's beta1, beta2)",
             lambda v: len(v) == 2 and all(0 <= b < 1 for b in v))

# verl's global micro-batch sizes, each also set per rank as {key}_per_gpu (ppo_config fills one from the other)
MICRO_BATCH_KEYS = ("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size", "critic.ppo_micro_batch_size",
                    "critic.forward_micro_batch_size", "reward_model.micro_batch_size")

OPTIM = {
    "lr": at_least(0),
    "lr_warmup_steps_ratio": within(0, 1),
    "min_lr_ratio": within(0, 1),
    "num_cycles": at_least(0),
    "weight_decay": at_least(0),
    "betas": BETAS,
    "eps": above(0),
}

RANGES: dict[str, Rule] = {
    "data.gen_batch_size": OPTIONAL_COUNT,
    "async_training.staleness_threshold": at_least(0),
    "async_training.trigger_parameter_sync_step": COUNT,
    "async_training.require_batches": COUNT,
    "rollout.total_rollout_steps": OPTIONAL_COUNT,
    "rollout.total_epochs": OPTIONAL_COUNT,
    "rollout.test_freq": OPTIONAL_COUNT,
    "data.max_response_length": COUNT,
    "data.val_batch_size": OPTIONAL_COUNT,
    "data.dataloader_num_workers": at_least(0),
    **{f"{key}{suffix}": OPTIONAL_COUNT for key in MICRO_BATCH_KEYS for suffix in ("", "_per_gpu")},
    **{key: COUNT for key in ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                              "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
                              "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size",
                              "critic.ulysses_sequence_parallel_size",
                              "critic.model.fsdp_config.ulysses_sequence_parallel_size")},
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": OPTIONAL_COUNT,
    # actor
    **{f"actor_rollout_ref.actor.optim.{key}": rule for key, rule in OPTIM.items()},
    "actor_rollout_ref.actor.optim.clip_grad": optional(at_least(0)),
    "actor_rollout_ref.actor.rollout_n": OPTIONAL_COUNT,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": COUNT,
    "actor_rollout_ref.actor.ppo_epochs": COUNT,
    "actor_rollout_ref.actor.clip_ratio": Rule("in [0, 1)", lambda v: 0 <= v < 1),
    # >= 1 leaves the ratio unbounded below (CISPO's recipe sets 10)
    "actor_rollout_ref.actor.clip_ratio_low": optional(at_least(0)),
    "actor_rollout_ref.actor.clip_ratio_high": optional(at_least(0)),
    "actor_rollout_ref.actor.clip_ratio_c": above(1),
    "actor_rollout_ref.actor.kl_loss_coef": at_least(0),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": SHARE,
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": SHARE,
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": at_least(0),
    "actor_rollout_ref.actor.policy_loss.dro_beta": optional(above(0)),
    "algorithm.pf_ppo.weight_pow": above(0),
    "actor_rollout_ref.actor.tau_pos": above(0),
    "actor_rollout_ref.actor.tau_neg": above(0),
    "actor_rollout_ref.actor.policy_loss.topr_negative_ratio_lower": at_least(0),
    "actor_rollout_ref.actor.policy_loss.topr_negative_ratio_upper": at_least(0),
    # reference policy and rollout
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": COUNT,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": COUNT,
    "actor_rollout_ref.rollout.gpu_memory_utilization": SHARE,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": COUNT,
    "actor_rollout_ref.rollout.max_num_batched_tokens": COUNT,
    "actor_rollout_ref.rollout.max_num_seqs": COUNT,
    "actor_rollout_ref.rollout.max_model_len": OPTIONAL_COUNT,
    "actor_rollout_ref.nccl_timeout": above(0),
    "critic.nccl_timeout": above(0),
    # critic (checked only when the advantage estimator uses one)
    **{f"critic.optim.{key}": rule for key, rule in OPTIM.items()},
    "critic.optim.clip_grad": optional(at_least(0)),
    "critic.rollout_n": OPTIONAL_COUNT,
    "critic.ppo_mini_batch_size": COUNT,
    "critic.ppo_max_token_len_per_gpu": COUNT,
    "critic.forward_max_token_len_per_gpu": COUNT,
    "critic.ppo_epochs": COUNT,
    "critic.cliprange_value": above(0),
    # reward model worker (checked only when reward_model.enable) and the rule-based reward functions
    "reward_model.max_length": OPTIONAL_COUNT,
    "reward_model.forward_max_token_len_per_gpu": COUNT,
    "reward_model.overlong_buffer.len": at_least(0),
    "reward_model.overlong_buffer.penalty_factor": at_least(0),
    "reward_model.reward_fn_timeout": above(0),
    "reward_model.reward_fn_workers": optional(at_least(0)),
    "reward_model.max_failure_share": within(0, 1),
    # algorithm
    "algorithm.gamma": within(0, 1),
    "algorithm.lam": within(0, 1),
    "algorithm.kl_ctrl.kl_coef": at_least(0),
    "algorithm.filter_groups.max_num_gen_batches": at_least(0),
    # trainer and Ray
    "trainer.total_epochs": COUNT,
    "trainer.total_training_steps": OPTIONAL_COUNT,
    "trainer.log_val_generations": at_least(0),
    "trainer.critic_warmup": at_least(0),
    "trainer.max_consecutive_skipped_steps": at_least(0),
    "trainer.nnodes": COUNT,
    "trainer.n_gpus_per_node": COUNT,
    "rollout.nnodes": COUNT,
    "rollout.n_gpus_per_node": at_least(0),
    "reward_model.nnodes": at_least(0),
    "reward_model.n_gpus_per_node": at_least(0),
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": COUNT,
    "ray_init.num_cpus": OPTIONAL_COUNT,
    "ray_init.object_store_memory": optional(above(0)),
}

UNCHECKED: dict[str, str] = {
    "data.max_prompt_length": "checked when the data config is built (RLDatasetConfig)",
    **dict.fromkeys(("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"),
                    "checked with the mini-batch arithmetic (config_checks)"),
    **dict.fromkeys(("data.seed", "actor_rollout_ref.actor.data_loader_seed", "critic.data_loader_seed",
                     "actor_rollout_ref.rollout.seed"), "any integer seeds a generator"),
    **dict.fromkeys(("actor_rollout_ref.actor.grad_clip", "critic.grad_clip"), "<= 0 turns gradient clipping off"),
    "actor_rollout_ref.actor.entropy_coeff": "a negative coefficient penalises entropy, as in verl",
    **dict.fromkeys(("actor_rollout_ref.actor.policy_loss.clip_cov_lb", "actor_rollout_ref.actor.policy_loss.clip_cov_ub"),
                    "a bound of a covariance window: any number"),
    "algorithm.gdpo_reward_weights": "any real weights (a negative one penalises its component); their count is "
                                     "checked against gdpo_reward_keys when the advantages are computed",
    **dict.fromkeys(("actor_rollout_ref.actor.optim.lr_warmup_steps", "critic.optim.lr_warmup_steps"),
                    "a negative value derives it from lr_warmup_steps_ratio"),
    **dict.fromkeys(("actor_rollout_ref.actor.optim.total_training_steps", "critic.optim.total_training_steps"),
                    "follows trainer.total_training_steps (ppo_config)"),
    **{f"{section}.fsdp_config.fsdp_size": "must divide the world size, or be -1 (config_checks)"
       for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model", "reward_model.model")},
    **{f"actor_rollout_ref.rollout.{key}": "checked when the rollout config is built (RolloutConfig)"
       for key in ("temperature", "top_k", "top_p", "prompt_length", "response_length", "n",
                   *(f"multi_turn.{name}" for name in ("max_assistant_turns", "max_user_turns", "max_parallel_calls",
                                                       "max_tool_response_length", "tool_timeout")))},
    **{f"actor_rollout_ref.rollout.val_kwargs.{key}": "checked when the rollout config is built (ValKwargs)"
       for key in ("temperature", "top_k", "top_p", "n")},
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "only null is accepted (MultiTurnConfig)",
    **dict.fromkeys(("algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl"),
                    "checked when the adaptive KL controller is built (config_checks)"),
    "trainer.save_freq": "<= 0 turns periodic checkpoints off",
    "trainer.test_freq": "<= 0 turns periodic validation off",
    **dict.fromkeys(("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
                    "null or <= 0 keeps every checkpoint"),
    "ray_init.cpus_per_worker": "checked with the placement (config_checks)",
    **{f"critic.model.{key}": "LoRA trains the actor only: only the default runs (config_rules.UNSUPPORTED)"
       for key in ("lora_rank", "lora_alpha")},
    **{f"actor_rollout_ref.model.{key}": "checked when the adapters are configured (hybridrl/models/lora.py)"
       for key in ("lora_rank", "lora_alpha")},
    **{f"actor_rollout_ref.rollout.{key}": "only 1 runs (config_rules.UNSUPPORTED)"
       for key in ("data_parallel_size", "expert_parallel_size", "pipeline_model_parallel_size")},
    **dict.fromkeys(("actor_rollout_ref.rollout.over_sample_rate", "reward_model.num_workers",
                     "data.filter_overlong_prompts_workers",
                     *(f"{role}.profiler.ranks" for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"))),
                    "no effect here (config_rules.NO_EFFECT)"),
    **{key: "not supported: only its default runs (config_rules.UNSUPPORTED)" for key in (
        "reward_model.ulysses_sequence_parallel_size", "reward_model.model.fsdp_config.ulysses_sequence_parallel_size",
        "trainer.ray_wait_register_center_timeout")},
}


# reward_model.* keys read by the rule-based reward manager, which runs whether or not a reward model does
RULE_BASED_REWARD_KEYS = ("reward_model.reward_fn_timeout", "reward_model.reward_fn_workers",
                          "reward_model.max_failure_share")


# the schema's defaults: what an error message offers as a valid value
SCHEMA_DEFAULTS = freeze(PPOTrainerConfig())


def in_use(config: PPOTrainerConfig, key: str) -> bool:
    """Keys of a role that does not run are not checked: a PPO setting left in a GRPO command is harmless."""
    if key.startswith("critic."):
        return uses_critic(config)
    if key.startswith("reward_model.") and key not in RULE_BASED_REWARD_KEYS \
            and not key.startswith("reward_model.overlong_buffer."):
        return config.reward_model.enable
    return True


def range_errors(config: PPOTrainerConfig) -> list[str]:
    """One message per numeric setting outside its range, naming the key, the range and a valid value."""
    errors = []
    for key, rule in RANGES.items():
        value = attrgetter(key)(config)
        if in_use(config, key) and not rule.ok(value):
            errors.append(f"{key}={as_override(value)} is out of range: it must be {rule.text}. "
                          f"Fix: e.g. {key}={as_override(attrgetter(key)(SCHEMA_DEFAULTS))} (the schema's default)")
    return errors


@dataclass(frozen=True)
class Unsupported:
    """A verl key hybridrl accepts but does not implement: only the values that run are accepted."""

    why: str  # what hybridrl does instead
    runs_with: tuple[Any, ...] | None = None  # the values that run; None: only the schema's default


NO_SEQUENCE_PARALLEL = Unsupported("the reward model's passes run without sequence parallelism (the actor, reference "
                                   "and critic have it); every reward-model rank holds whole sequences")
NO_COMPILE = Unsupported("models run eagerly; torch.compile is not wired into the FSDP engine")
ONE_ENGINE = Unsupported("FSDP2 (fully_shard) is the only training engine; megatron is not available",
                         runs_with=STRATEGIES)
NO_HDFS = Unsupported("checkpoints are written to trainer.default_local_dir only; copy them elsewhere yourself")
NO_CRITIC_LORA = Unsupported("LoRA adapters train the actor only (actor_rollout_ref.model.lora_rank); the critic "
                             "trains every parameter")
ONE_ROLLOUT_GROUP = Unsupported("the rollout engine runs inside each worker with tensor parallelism only "
                                "(actor_rollout_ref.rollout.tensor_model_parallel_size)")
UNSUPPORTED: dict[str, Unsupported] = {
    "async_training.compute_prox_log_prob": Unsupported(
        "the trainer recomputes the old log-probs of every async batch and weighs tokens by truncated importance "
        "ratios against the rollout's (algorithm.rollout_correction; docs/placement.md)"),
    "async_training.use_trainer_do_validate": Unsupported(
        "validation generates on the rollout pool, parked at a call boundary while it runs"),
    "reward_model.ulysses_sequence_parallel_size": NO_SEQUENCE_PARALLEL,
    "reward_model.model.fsdp_config.ulysses_sequence_parallel_size": NO_SEQUENCE_PARALLEL,
    "actor_rollout_ref.actor.use_torch_compile": NO_COMPILE,
    "actor_rollout_ref.ref.use_torch_compile": NO_COMPILE,
    **{f"{section}.strategy": ONE_ENGINE for section in (
        "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model", "actor_rollout_ref.actor.fsdp_config",
        "actor_rollout_ref.ref.fsdp_config", "critic.model.fsdp_config", "reward_model.model.fsdp_config")},
    "data.return_raw_input_ids": Unsupported(
        "a reward model with its own tokenizer gets the conversation re-tokenised instead "
        "(reward_model.model.input_tokenizer)"),
    **dict.fromkeys(("trainer.default_hdfs_dir", "trainer.del_local_ckpt_after_load"), NO_HDFS),
    "trainer.ray_wait_register_center_timeout": Unsupported(
        "hybridrl's Ray worker groups have no register center to wait for"),
    "ray_init.timeline_json_file": Unsupported("Ray timelines are not dumped; call ray.timeline() yourself"),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": Unsupported(
        "the agent loop keeps every turn's tokens as the model sampled them and never re-renders earlier turns "
        "with another chat template"),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": Unsupported(
        "multi-turn rollouts are not repeated; rollout.n sets the samples per prompt"),
    "actor_rollout_ref.actor.global_batch_info": Unsupported(
        "the actor fills it per mini-batch with the totals the policy loss normalises by; it is not a setting"),
    **{f"critic.model.{key}": NO_CRITIC_LORA
       for key in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules", "lora_adapter_path")},
    **{f"actor_rollout_ref.rollout.{key}": ONE_ROLLOUT_GROUP
       for key in ("data_parallel_size", "expert_parallel_size", "pipeline_model_parallel_size")},
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": Unsupported(
        "custom agent loops are not supported; the loops are tool_agent and single_turn_agent "
        "(hybridrl/workers/rollout/agent_loop.py)"),
}

# Keys whose every value runs the same way, because hybridrl always does what they ask for.
SAME_EITHER_WAY: dict[str, str] = {
    **{f"{model}.use_remove_padding": "padding columns are always trimmed per micro-batch; flash-attention's "
                                      "padding-free kernels are not used"
       for model in ("actor_rollout_ref.model", "critic.model", "reward_model.model")},
    "use_remove_padding": "SFT's micro-batches are always cut to their longest row; the loss is the same",
    "actor_rollout_ref.rollout.layered_summon": "the actor's weights reach an engine with its own copy (vLLM) "
                                                "one gathered tensor at a time, LoRA merged in, whatever it is set to",
    "trainer.use_legacy_worker_impl": "hybridrl has one worker implementation (hybridrl/workers/fsdp_workers.py)",
    "trainer.weight_sync_with_ray": "a rollout pool of its own always receives the weights through a process group "
                                    "of its own (hybridrl/workers/weight_sync.py)",
    "reward_model.use_reward_loop": "rule-based rewards score in the driver's reward processes and a reward model "
                                    "in its worker group, whichever of verl's paths is named",
    "actor_rollout_ref.actor.use_prefix_grouper": "a prompt shared by a group's responses is computed once "
                                                  "whenever actor_rollout_ref.model.share_prompt_forward is on",
}


@dataclass(frozen=True)
class NoEffect:
    """A verl key that changes nothing in this run, warned about when set. `acts_when`: the runs where it acts."""

    why: str
    acts_when: Callable[[PPOTrainerConfig], bool] | None = None


def _runs_vllm(config: PPOTrainerConfig) -> bool:
    return config.actor_rollout_ref.rollout.name == "vllm"


VLLM_ONLY = NoEffect("vLLM engine settings, and actor_rollout_ref.rollout.name is not vllm", _runs_vllm)
GPU_SPEED_UPS = NoEffect("verl's GPU speed and memory switches that change no result; hybridrl's engine has "
                         "its own (docs/performance.md)")
NO_PROFILER = NoEffect("verl's profiler is not implemented; profile a step with benchmarks/profile_step.py")
NOT_SERVED = NoEffect("verl's server-based rollout and reward loop; hybridrl's engines run inside the worker "
                      "processes and take the actor's weights in-process, the reward model scores in its worker "
                      "group, and code runs in the local sandbox (reward_model.sandbox)")
ROLLOUT = "actor_rollout_ref.rollout"

NO_EFFECT: dict[str, NoEffect] = {
    "data.filter_overlong_prompts_workers": NoEffect(
        "prompt lengths are measured in the driver with batched tokenizer calls, not in worker processes; the "
        "same prompts are filtered either way"),
    "data.gen_batch_size": NoEffect(
        "prompts per generation round: streaming admits prompts one by one as rows free up, and the other modes "
        "generate data.train_batch_size prompts a round (with algorithm.filter_groups, rounds repeat until full)"),
    f"{ROLLOUT}.max_num_seqs": NoEffect(
        "the rows an engine decodes at once: vLLM's, or the HF engine's continuous batch in async_training.mode="
        "streaming", lambda c: _runs_vllm(c) or c.async_training.mode == "streaming"),
    **{f"{ROLLOUT}.{key}": VLLM_ONLY for key in (
        "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill", "enable_prefix_caching",
        "load_format", "disable_log_stats", "cudagraph_capture_sizes", "engine_kwargs.vllm", "gpu_memory_utilization",
        "tensor_model_parallel_size", "free_cache_engine")},
    f"{ROLLOUT}.engine_kwargs.sglang": NoEffect("settings of the SGLang engine, which hybridrl does not have"),
    f"{ROLLOUT}.engine_kwargs.trtllm": NoEffect("settings of the TensorRT-LLM engine, which hybridrl does not have"),
    f"{ROLLOUT}.multi_stage_wake_up": NoEffect("an SGLang memory setting; hybridrl does not have SGLang"),
    f"{ROLLOUT}.mode": NoEffect("verl's server-style asynchronous rollout is not implemented; every batch is "
                                "generated whole by the engine inside the workers (mode=sync)"),
    **{f"{ROLLOUT}.{key}": NOT_SERVED for key in (
        "over_sample_rate", "skip_tokenizer_init", "trace", "prometheus", "checkpoint_engine.backend",
        "checkpoint_engine.engine_kwargs")},
    f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes": NoEffect(
        "the bucket size of a weight sync to a rollout pool of its own; colocated, the rollout reads the actor's "
        "weights in place (actor_rollout_ref.hybrid_engine=true)", lambda c: not c.actor_rollout_ref.hybrid_engine),
    **{f"reward_model.{key}": NOT_SERVED for key in ("num_workers", "rollout", "sandbox_fusion")},
    **{f"{model}.{key}": GPU_SPEED_UPS
       for model in ("actor_rollout_ref.model", "critic.model")
       for key in ("use_shm", "use_fused_kernels", "fused_kernel_options", "use_liger", "enable_activation_offload")},
    **{f"{role}.{key}": GPU_SPEED_UPS for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref")
       for key in ("entropy_checkpointing", "entropy_from_logits_with_chunking")},
    **{f"{fsdp}.fsdp_config.forward_prefetch": GPU_SPEED_UPS for fsdp in (
        "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model", "reward_model.model")},
    **{f"{role}.profiler": NO_PROFILER for role in (
        "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")},
    "global_profiler": NO_PROFILER,
}


def no_effect_warnings(config: PPOTrainerConfig) -> list[str]:
    """One message per reason, naming every key set away from its default that acts nowhere in this run."""
    by_reason: dict[NoEffect, list[str]] = {}
    for key, rule in NO_EFFECT.items():
        value = attrgetter(key)(config)
        if value != attrgetter(key)(SCHEMA_DEFAULTS) and not (rule.acts_when and rule.acts_when(config)):
            by_reason.setdefault(rule, []).append(f"{key}={as_override(value)}")
    return [f"no effect in this run: {', '.join(keys)} ({rule.why})" for rule, keys in by_reason.items()]


def unsupported_errors(config: PPOTrainerConfig) -> list[str]:
    """One message per key set to a value hybridrl cannot run (keys of roles that do not run are skipped)."""
    errors = []
    for key, rule in UNSUPPORTED.items():
        value, default = attrgetter(key)(config), attrgetter(key)(SCHEMA_DEFAULTS)
        runs_with = rule.runs_with if rule.runs_with is not None else (default,)
        if in_use(config, key) and value not in runs_with:
            fix = f"set it to {as_override(default)}" if len(runs_with) == 1 else \
                f"set it to one of {', '.join(map(as_override, runs_with))}"
            errors.append(f"{key}={as_override(value)} is not supported by hybridrl: {rule.why}. "
                          f"Remove it or {fix}")
    return errors


def offload_errors(config: PPOTrainerConfig) -> list[str]:
    """`*.fsdp_config.param_offload` / `optimizer_offload` where nothing moves the state: the workers' checks."""
    device = config.trainer.device
    errors = actor_offload_refusals(config.actor_rollout_ref, actor_role_name(config), device)
    if uses_reference(config):
        errors += offload_refusals(config.actor_rollout_ref.ref.fsdp_config, "actor_rollout_ref.ref", device)
    if uses_critic(config):
        errors += offload_refusals(config.critic.model.fsdp_config, "critic.model", device)
    if config.reward_model.enable:
        errors += offload_refusals(config.reward_model.model.fsdp_config, "reward_model.model", device)
    return errors
