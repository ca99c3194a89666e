"""The allowed range of every numeric PPO setting, checked before any worker starts.

A value out of range used to fail deep inside a worker after Ray had started (a negative learning
rate in torch's AdamW), or to run silently wrong. `RANGES` maps each numeric key of the schema to
its rule; `UNCHECKED` lists the numeric keys checked elsewhere or valid at any value, with the reason.
The schema test walks `PPOTrainerConfig` and fails when a numeric key is in neither, so a new key
gets a range when it is added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from hybridrl.algos import get_adv_estimator_spec
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.utils.typed_config import as_override


@dataclass(frozen=True)
class Rule:
    text: str  # the allowed values, as the error message states them
    ok: Callable[[Any], bool]


def at_least(low: float) -> Rule:
    return Rule(f">= {low}", lambda v: v >= low)


def above(low: float) -> Rule:
    return Rule(f"> {low}", lambda v: v > low)


def within(low: float, high: float, *, high_open: bool = False) -> Rule:
    if high_open:
        return Rule(f"in [{low}, {high})", lambda v: low <= v < high)
    return Rule(f"in [{low}, {high}]", lambda v: low <= v <= high)


def optional(rule: Rule) -> Rule:
    return Rule(f"null or {rule.text}", lambda v: v is None or rule.ok(v))


COUNT = at_least(1)
OPTIONAL_COUNT = optional(at_least(1))  # unset (null) or a positive count
BETAS = Rule("a list of two numbers in [0, 1) (AdamW's beta1, beta2)",
             lambda v: len(v) == 2 and all(0 <= b < 1 for b in v))

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
    "data.max_response_length": COUNT,
    "data.val_batch_size": OPTIONAL_COUNT,
    "data.dataloader_num_workers": at_least(0),
    # actor
    **{f"actor_rollout_ref.actor.optim.{key}": rule for key, rule in OPTIM.items()},
    "actor_rollout_ref.actor.rollout_n": OPTIONAL_COUNT,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": OPTIONAL_COUNT,
    "actor_rollout_ref.actor.ppo_micro_batch_size": OPTIONAL_COUNT,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": COUNT,
    "actor_rollout_ref.actor.ppo_epochs": COUNT,
    "actor_rollout_ref.actor.clip_ratio": within(0, 1, high_open=True),
    "actor_rollout_ref.actor.clip_ratio_low": optional(within(0, 1, high_open=True)),
    "actor_rollout_ref.actor.clip_ratio_high": optional(at_least(0)),
    "actor_rollout_ref.actor.clip_ratio_c": above(1),
    "actor_rollout_ref.actor.kl_loss_coef": at_least(0),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": Rule("in (0, 1]", lambda v: 0 < v <= 1),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": Rule("in (0, 1]", lambda v: 0 < v <= 1),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": at_least(0),
    "actor_rollout_ref.actor.policy_loss.dro_beta": optional(above(0)),
    "algorithm.pf_ppo.weight_pow": above(0),
    "actor_rollout_ref.actor.tau_pos": above(0),
    "actor_rollout_ref.actor.tau_neg": above(0),
    "actor_rollout_ref.actor.policy_loss.topr_negative_ratio_lower": at_least(0),
    "actor_rollout_ref.actor.policy_loss.topr_negative_ratio_upper": at_least(0),
    # reference policy and rollout
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": OPTIONAL_COUNT,
    "actor_rollout_ref.ref.log_prob_micro_batch_size": OPTIONAL_COUNT,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": COUNT,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": OPTIONAL_COUNT,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": COUNT,
    "actor_rollout_ref.rollout.gpu_memory_utilization": Rule("in (0, 1]", lambda v: 0 < v <= 1),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": COUNT,
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": OPTIONAL_COUNT,
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": OPTIONAL_COUNT,
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": COUNT,
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": COUNT,
    "actor_rollout_ref.rollout.multi_turn.tool_timeout": above(0),
    # critic (checked only when the advantage estimator uses one)
    **{f"critic.optim.{key}": rule for key, rule in OPTIM.items()},
    "critic.rollout_n": OPTIONAL_COUNT,
    "critic.ppo_mini_batch_size": COUNT,
    "critic.ppo_micro_batch_size_per_gpu": OPTIONAL_COUNT,
    "critic.ppo_micro_batch_size": OPTIONAL_COUNT,
    "critic.forward_micro_batch_size_per_gpu": OPTIONAL_COUNT,
    "critic.forward_micro_batch_size": OPTIONAL_COUNT,
    "critic.ppo_max_token_len_per_gpu": COUNT,
    "critic.forward_max_token_len_per_gpu": COUNT,
    "critic.ppo_epochs": COUNT,
    "critic.cliprange_value": above(0),
    # reward model worker (checked only when reward_model.enable) and the rule-based reward functions
    "reward_model.micro_batch_size": OPTIONAL_COUNT,
    "reward_model.micro_batch_size_per_gpu": OPTIONAL_COUNT,
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
    "ray_init.num_cpus": OPTIONAL_COUNT,
    "ray_init.object_store_memory": optional(above(0)),
}

ANY_SEED = "any integer seeds a generator"
UNCHECKED: dict[str, str] = {
    "data.max_prompt_length": "checked when the data config is built (RLDatasetConfig)",
    "data.train_batch_size": "checked with the mini-batch arithmetic (config_checks)",
    "data.seed": ANY_SEED,
    "actor_rollout_ref.actor.ppo_mini_batch_size": "checked with the mini-batch arithmetic (config_checks)",
    "actor_rollout_ref.actor.grad_clip": "<= 0 turns gradient clipping off",
    "actor_rollout_ref.actor.entropy_coeff": "a negative coefficient penalises entropy, as in verl",
    "actor_rollout_ref.actor.data_loader_seed": ANY_SEED,
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": "a bound of a covariance window: any number",
    "algorithm.gdpo_reward_weights": "any real weights (a negative one penalises its component); their count is "
                                     "checked against gdpo_reward_keys when the advantages are computed",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": "a bound of a covariance window: any number",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "a negative value derives it from lr_warmup_steps_ratio",
    "actor_rollout_ref.actor.optim.total_training_steps": "set by the trainer from the data size",
    "critic.optim.lr_warmup_steps": "a negative value derives it from lr_warmup_steps_ratio",
    "critic.optim.total_training_steps": "set by the trainer from the data size",
    "critic.grad_clip": "<= 0 turns gradient clipping off",
    "critic.data_loader_seed": ANY_SEED,
    **{f"{section}.fsdp_config.fsdp_size": "must be -1 or the world size (config_checks)"
       for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model", "reward_model.model")},
    **{f"actor_rollout_ref.rollout.{key}": "checked when the rollout config is built (RolloutConfig)"
       for key in ("temperature", "top_k", "top_p", "prompt_length", "response_length", "n")},
    **{f"actor_rollout_ref.rollout.val_kwargs.{key}": "checked when the rollout config is built (ValKwargs)"
       for key in ("temperature", "top_k", "top_p", "n")},
    "actor_rollout_ref.rollout.seed": ANY_SEED,
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "only null is accepted (MultiTurnConfig)",
    "algorithm.kl_ctrl.horizon": "checked when the adaptive KL controller is built (config_checks)",
    "algorithm.kl_ctrl.target_kl": "checked when the adaptive KL controller is built (config_checks)",
    "trainer.nnodes": "checked with the placement (config_checks)",
    "trainer.n_gpus_per_node": "checked with the placement (config_checks)",
    "trainer.save_freq": "<= 0 turns periodic checkpoints off",
    "trainer.test_freq": "<= 0 turns periodic validation off",
    "trainer.max_actor_ckpt_to_keep": "null or <= 0 keeps every checkpoint",
    "trainer.max_critic_ckpt_to_keep": "null or <= 0 keeps every checkpoint",
    "ray_init.cpus_per_worker": "checked with the placement (config_checks)",
    **{key: "not supported: only its default runs (config_support.UNSUPPORTED)" for key in (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
        "critic.ulysses_sequence_parallel_size", "reward_model.ulysses_sequence_parallel_size",
        "trainer.ray_wait_register_center_timeout", "data.filter_overlong_prompts_workers")},
}


def lookup(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


# reward_model.* keys read by the rule-based reward manager, which runs whether or not a reward model does
RULE_BASED_REWARD_KEYS = ("reward_model.reward_fn_timeout", "reward_model.reward_fn_workers",
                          "reward_model.max_failure_share")


@cache
def schema_defaults() -> PPOTrainerConfig:
    """The schema's defaults, built once: what an error message offers as a valid value."""
    return PPOTrainerConfig()


def in_use(config: PPOTrainerConfig, key: str) -> bool:
    """Keys of a role that does not run are not checked: a PPO setting left in a GRPO command is harmless."""
    if key.startswith("critic."):
        return get_adv_estimator_spec(config.algorithm.adv_estimator).needs_critic
    if key.startswith("reward_model.") and key not in RULE_BASED_REWARD_KEYS \
            and not key.startswith("reward_model.overlong_buffer."):
        return config.reward_model.enable
    return True


def range_errors(config: PPOTrainerConfig) -> list[str]:
    """One message per numeric setting outside its range, naming the key, the range and a valid value."""
    errors = []
    for key, rule in RANGES.items():
        value = lookup(config, key)
        if in_use(config, key) and not rule.ok(value):
            errors.append(f"{key}={as_override(value)} is out of range: it must be {rule.text}. "
                          f"Fix: e.g. {key}={as_override(lookup(schema_defaults(), key))} (the schema's default)")
    return errors
