"""A run's config resolved once, before any worker starts, and checked on resume against the config saved then.

`resolve_config` fails naming the keys and the fix, fills in the derived settings and freezes the result.
On resume, `report_config_changes` logs every key that differs from the config saved with the checkpoint.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from hybridrl.algos import get_adv_estimator_spec, get_kl_controller, get_policy_loss_fn, kl_penalty
from hybridrl.algos.adv_registry import AdvEstimatorSpec
from hybridrl.algos.policy_loss import applies_rollout_is_weights, own_aggregation
from hybridrl.models.loading import DTYPES, resolve_dtype
from hybridrl.models.lora import LoRAError, LoRASettings
from hybridrl.rewards.managers import REWARD_MANAGERS
from hybridrl.trainer.config_rules import no_effect_warnings, offload_errors, range_errors, unsupported_errors
from hybridrl.trainer.placement import check_backend, placement_errors, uses_critic
from hybridrl.trainer.ppo_config import PPOTrainerConfig, fill_derived, fill_training_steps, world_size
from hybridrl.utils.device import AUTO, emulated_bf16_warning
from hybridrl.utils.typed_config import ConfigError, added_keys, freeze, require, unknown_key_message
from hybridrl.workers.config import actor_sequence_parallel
from hybridrl.workers.rollout import ROLLOUT_ENGINES

__all__ = ["ConfigError", "batch_plan", "read_run_config", "report_config_changes", "resolve_config",
           "world_size", "write_run_config"]

logger = logging.getLogger(__name__)


def resolve_config(config: PPOTrainerConfig | DictConfig,
                   train_rows: Callable[[PPOTrainerConfig], int] | None = None) -> PPOTrainerConfig:
    """The run's config: checked, derived values filled in, frozen; raises ConfigError naming the keys.
    `train_rows(config)`, called once the checks pass, counts the prompts for the total_training_steps keys."""
    config = OmegaConf.to_object(config) if isinstance(config, DictConfig) else copy.deepcopy(config)
    errors = [unknown_key_message(key, known) for key, known in added_keys(config)] or \
        range_errors(config) + unsupported_errors(config)
    require(not errors, "\n".join(errors))
    fill_derived(config)
    _check_placement(config)
    errors = offload_errors(config)
    require(not errors, "\n".join(errors))
    _check_names(config)
    try:  # the actor's LoRA keys
        LoRASettings.from_model_config(config.actor_rollout_ref.model)
    except LoRAError as err:
        require(False, str(err))
    _check_batches(config)
    _check_lengths(config)
    for warning in no_effect_warnings(config):
        logger.warning(warning)
    if train_rows is not None:
        fill_training_steps(config, train_rows(config))
    return freeze(config)


def _check_placement(config: PPOTrainerConfig) -> None:
    t, ranks = config.trainer, world_size(config)
    check_backend(t)
    require(config.ray_init.cpus_per_worker >= 1,
             f"ray_init.cpus_per_worker must be >= 1 (CPUs and torch threads per worker rank), "
             f"got {config.ray_init.cpus_per_worker}")
    errors = placement_errors(config)
    require(not errors, "\n".join(errors))
    require(not config.reward_model.enable or bool(config.reward_model.model.path),
             "reward_model.enable=true needs reward_model.model.path=<local reward model directory>")
    require(t.resume_mode in ("auto", "disable", "resume_path"),
             f"trainer.resume_mode must be auto, disable or resume_path, got {t.resume_mode!r}")
    require(t.resume_mode != "resume_path" or bool(t.resume_from_path),
             "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
    arr = config.actor_rollout_ref
    for key, fsdp in (("actor_rollout_ref.actor", arr.actor.fsdp_config), ("actor_rollout_ref.ref", arr.ref.fsdp_config),
                      ("critic.model", config.critic.model.fsdp_config),
                      ("reward_model.model", config.reward_model.model.fsdp_config)):
        require(fsdp.fsdp_size < 0 or fsdp.fsdp_size >= ranks or (fsdp.fsdp_size > 0 and ranks % fsdp.fsdp_size == 0),
                 f"{key}.fsdp_config.fsdp_size={fsdp.fsdp_size} must divide the world size ({ranks}) for hybrid "
                 f"sharding, or be -1 to shard over every rank")
        _check_dtype(f"{key}.fsdp_config.mixed_precision.param_dtype", fsdp.mixed_precision.param_dtype, t.device)
        # master weights in fp32 or bf16: fp16 ones would need loss scaling, which the engine does not do
        require(fsdp.model_dtype in DTYPES and resolve_dtype(fsdp.model_dtype) in (torch.float32, torch.bfloat16),
                f"{key}.fsdp_config.model_dtype={fsdp.model_dtype!r}: the weights' dtype must be float32 (fp32) or "
                f"bfloat16 (bf16)")
        _check_dtype(f"{key}.fsdp_config.mixed_precision.reduce_dtype", fsdp.mixed_precision.reduce_dtype)
        if fsdp.mixed_precision.buffer_dtype is not None:
            _check_dtype(f"{key}.fsdp_config.mixed_precision.buffer_dtype", fsdp.mixed_precision.buffer_dtype)
    _check_dtype("actor_rollout_ref.rollout.dtype", arr.rollout.dtype, t.device)


def _check_dtype(key: str, value: str | None, compute_device: str | None = None) -> None:
    """A dtype or `auto`; `compute_device` (trainer.device) for a compute dtype, to warn of emulated bf16."""
    automatic = f"{AUTO} (bf16 on a GPU that multiplies it natively, fp32 on a CPU)"
    if value is None:
        raise ConfigError(f"{key}=null is not a dtype; the automatic one is {automatic}: set {key}={AUTO}, or one "
                          f"of {', '.join(DTYPES.names())}")
    if value == AUTO:
        return  # device-dependent: a GPU worker resolves it on its own device, the driver need not ask it
    require(value in DTYPES, f"{key}={value!r} is not a dtype: use one of {', '.join(DTYPES.names())}, or {automatic}")
    warning = compute_device and emulated_bf16_warning(key, value, compute_device)
    if warning:
        logger.warning(warning)


def _check_names(config: PPOTrainerConfig) -> None:
    """Names looked up in registries: an unknown one raises listing the registered names."""
    algo, arr = config.algorithm, config.actor_rollout_ref
    _check_estimator_settings(config, get_adv_estimator_spec(algo.adv_estimator))
    loss = get_policy_loss_fn(arr.actor.policy_loss.loss_mode)
    fixed = own_aggregation(arr.actor.policy_loss.loss_mode)
    if fixed is not None and fixed != arr.actor.loss_agg_mode:
        logger.warning("actor_rollout_ref.actor.loss_agg_mode=%s does not apply to policy_loss.loss_mode=%s, which "
                       "aggregates its tokens as %s (its paper's objective, as in verl); the entropy and KL loss "
                       "terms still use loss_agg_mode", arr.actor.loss_agg_mode, arr.actor.policy_loss.loss_mode,
                       fixed)
    correction = algo.rollout_correction
    if correction.bypass_mode and correction.rollout_is is not None and correction.loss_type == "ppo_clip":
        logger.warning("algorithm.rollout_correction.rollout_is=%s in bypass mode with loss_type=ppo_clip: the IS "
                       "weights are reported (rollout_corr/* metrics) but not applied, since the clipped ratio "
                       "pi_theta / pi_rollout corrects the mismatch already (as in verl); loss_type=reinforce "
                       "applies them", correction.rollout_is)
    # bypass mode applies its weights in its own REINFORCE loss, not the actor's
    require(correction.rollout_is is None or correction.bypass_mode or applies_rollout_is_weights(loss),
             f"algorithm.rollout_correction.rollout_is={correction.rollout_is} needs a policy loss "
             f"that applies rollout_is_weights; actor_rollout_ref.actor.policy_loss.loss_mode="
             f"{arr.actor.policy_loss.loss_mode} does not")
    require(correction.rollout_rs is None or correction.rollout_rs_threshold is not None,
             f"algorithm.rollout_correction.rollout_rs needs rollout_rs_threshold (rollout_rs="
             f"{correction.rollout_rs}): set algorithm.rollout_correction.rollout_rs_threshold, one bound per "
             f"option or one for all, e.g. 2.0 ('lower_upper' such as '0.5_2.0' for the k1 options)")
    get_kl_controller(**vars(algo.kl_ctrl))
    probe = torch.zeros(1, 1)
    kl_penalty(probe, probe, algo.kl_penalty)
    kl_penalty(probe, probe, arr.actor.kl_loss_type)
    ROLLOUT_ENGINES.get(arr.rollout.name)
    REWARD_MANAGERS.get(config.reward_model.reward_manager)


def _check_estimator_settings(config: PPOTrainerConfig, spec: AdvEstimatorSpec) -> None:
    """Keys only some estimators read (gdpo's, PF-PPO, sum_pi_squared): set where ignored or missing where needed."""
    algo, arr = config.algorithm, config.actor_rollout_ref
    reads_gdpo_keys = spec.accepts_any_input or "config" in spec.parameters
    for key in ("gdpo_reward_keys", "gdpo_reward_weights"):
        require(getattr(algo, key) is None or bool(reads_gdpo_keys),
                 f"algorithm.{key} is set but algorithm.adv_estimator={algo.adv_estimator} does not read it: use "
                 f"adv_estimator=gdpo, or leave {key} unset")
    require(not algo.use_pf_ppo or algo.adv_estimator == "gae",
             f"algorithm.use_pf_ppo=true resamples the batch after GAE's advantages only (as verl); "
             f"algorithm.adv_estimator={algo.adv_estimator} would ignore it: use adv_estimator=gae or set it false")
    require(algo.use_pf_ppo or algo.pf_ppo == type(algo.pf_ppo)(),
             "algorithm.pf_ppo.* acts only with algorithm.use_pf_ppo=true; set it, or leave pf_ppo at its defaults")
    sum_pi_key = "actor_rollout_ref.actor.calculate_sum_pi_squared"
    needs_sum_pi = "sum_pi_squared" in spec.required_inputs
    reads_sum_pi = spec.accepts_any_input or "sum_pi_squared" in spec.parameters
    require(arr.actor.calculate_sum_pi_squared or not needs_sum_pi,
             f"algorithm.adv_estimator={algo.adv_estimator} needs sum_pi_squared from the old log-prob pass: set "
             f"{sum_pi_key}=true")
    require(not arr.actor.calculate_sum_pi_squared or reads_sum_pi,
             f"{sum_pi_key}=true computes a column algorithm.adv_estimator={algo.adv_estimator} does not read: "
             f"use adv_estimator=optimal_token_baseline or tir_optimal_token_baseline, or set it to false")
    require(not (arr.actor.calculate_sum_pi_squared and algo.rollout_correction.bypass_mode),
             f"{sum_pi_key}=true needs the old log-prob pass, which algorithm.rollout_correction.bypass_mode=true "
             f"skips")


def _check_batches(config: PPOTrainerConfig) -> None:
    data, arr, ws = config.data, config.actor_rollout_ref, world_size(config)
    n = arr.rollout.n
    mini = arr.actor.ppo_mini_batch_size
    require(data.train_batch_size >= 1 and mini >= 1,
             f"data.train_batch_size ({data.train_batch_size}) and actor_rollout_ref.actor.ppo_mini_batch_size "
             f"({mini}) must be >= 1")
    minis = {"actor_rollout_ref.actor.ppo_mini_batch_size": mini}
    if uses_critic(config):
        minis["critic.ppo_mini_batch_size"] = config.critic.ppo_mini_batch_size
    for key, size in minis.items():
        require(data.train_batch_size % size == 0, f"data.train_batch_size ({data.train_batch_size}) must be a "
                f"multiple of {key} ({size}): each step makes whole mini-batches")
        require(size * n % ws == 0, f"{key} ({size}) x actor_rollout_ref.rollout.n ({n}) must be divisible by the "
                f"data-parallel size ({ws}): change either, or trainer.n_gpus_per_node")
    require(not config.algorithm.filter_groups.enable or n > 1,
             "algorithm.filter_groups.enable needs rollout.n > 1: a single sample per prompt never varies")
    require(not (config.algorithm.filter_groups.enable and config.reward_model.launch_reward_fn_async),
             "algorithm.filter_groups.enable needs the scores before the batch is complete, so they cannot be "
             "computed in the background; set reward_model.launch_reward_fn_async=false")
    require(config.data.sampler.class_path is None or config.data.dataloader_num_workers == 0,
             f"data.sampler names a sampler of your own, whose state is exact only when prompts are drawn as they "
             f"are consumed: set data.dataloader_num_workers=0 (got {config.data.dataloader_num_workers})")
    vk = arr.rollout.val_kwargs
    if vk.n > 1 and not (vk.do_sample and vk.temperature > 0):
        logger.warning("actor_rollout_ref.rollout.val_kwargs.n=%d with greedy decoding (do_sample=%s, temperature=%s) "
                       "validates %d identical responses per prompt, as verl does; set val_kwargs.do_sample=true and "
                       "a temperature > 0 for distinct samples", vk.n, vk.do_sample, vk.temperature, vk.n)


def _check_lengths(config: PPOTrainerConfig) -> None:
    data, rollout = config.data, config.actor_rollout_ref.rollout
    for key in ("prompt_length", "response_length"):
        ours, theirs = getattr(rollout, key), getattr(data, f"max_{key}")
        require(ours == theirs, f"rollout.{key} ({ours}) must equal data.max_{key} ({theirs}); leave it at "
                f"its default ${{data.max_{key}}}")
    actor = config.actor_rollout_ref.actor
    total = data.max_prompt_length + data.max_response_length
    sp = actor_sequence_parallel(config.actor_rollout_ref)[0]  # a group's pass holds sp ranks' budgets
    require(not actor.use_dynamic_bsz or actor.ppo_max_token_len_per_gpu * sp >= total,
             f"actor.ppo_max_token_len_per_gpu ({actor.ppo_max_token_len_per_gpu}) x ulysses_sequence_parallel_size "
             f"({sp}) must hold one sequence (max_prompt_length + max_response_length = {total})")


def batch_plan(config: PPOTrainerConfig) -> dict[str, int]:
    """The effective batch arithmetic of one training step."""
    arr, ws = config.actor_rollout_ref, world_size(config)
    n = arr.rollout.n
    rows = config.data.train_batch_size * n
    mini_rows_per_rank = arr.actor.ppo_mini_batch_size * n // ws
    micro = arr.actor.ppo_micro_batch_size_per_gpu or mini_rows_per_rank
    sp = actor_sequence_parallel(arr)[0]  # a sequence-parallel group shares its ranks' rows
    unit = "rank" if sp == 1 else "sequence-parallel group"
    return {
        "prompts per step": config.data.train_batch_size,
        "samples per prompt (rollout.n)": n,
        "rows per step (global batch)": rows,
        "worker processes (data-parallel ranks)" if sp == 1 else "worker processes (ranks)": ws,
        **({"ranks per sequence-parallel group (actor)": sp} if sp > 1 else {}),
        f"rows per {unit} per step": rows // ws * sp,
        "optimizer steps per rollout": config.data.train_batch_size // arr.actor.ppo_mini_batch_size
        * arr.actor.ppo_epochs,
        f"rows per {unit} per mini-batch": mini_rows_per_rank * sp,
        f"micro-batches per {unit} per mini-batch": math.ceil(mini_rows_per_rank * sp / micro)
        if not arr.actor.use_dynamic_bsz else -1,
    }


# Keys whose value may be a 'lower_upper' string ("0.5_5.0"), which Hydra, like Python, reads unquoted as one
# number ('_' between digits is a digit separator: 1_5 -> 15).
BOUNDS_KEYS = ("rollout_is_threshold", "rollout_rs_threshold")


def bounds_read_as_numbers(overrides: list[str]) -> list[str]:
    """One message per override of a `BOUNDS_KEYS` key whose text holds '_' but which Hydra parsed as a number."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    problems = []
    for line in overrides:
        override = parser.parse_override(line)
        key, text = override.key_or_group, line.split("=", 1)[-1]
        value = override.value()
        if key.rsplit(".", 1)[-1] in BOUNDS_KEYS and "_" in text and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            problems.append(f"{key}={text} reached the config as the number {value!r}: on the command line '_' "
                            f"between digits is a digit separator. For lower_upper bounds quote the value "
                            f"({key}='{text}')")
    return problems


RUN_CONFIG_FILE = "run_config.json"
# Keys that say where to resume from: they differ between a run and its resumption by design.
RESUME_KEYS = frozenset({"trainer.resume_mode", "trainer.resume_from_path"})


def write_run_config(step_dir: str | Path, config: Mapping[str, Any]) -> None:
    # default=str: the config is plain data, but a value typed Any may hold an object without a JSON form
    (Path(step_dir) / RUN_CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str))


def read_run_config(step_dir: str | Path) -> dict[str, Any] | None:
    """The config saved with the checkpoint, or None (a checkpoint from before configs were saved)."""
    path = Path(step_dir) / RUN_CONFIG_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def report_config_changes(step_dir: str | Path, current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Log, as one warning, each key that differs from the config saved in `step_dir` (or exists in one only);
    returns them as dotted key -> (saved value, current value)."""
    saved = read_run_config(step_dir)
    if saved is None:
        logger.warning("%s has no %s (saved by an older version): cannot tell which settings changed since",
                       step_dir, RUN_CONFIG_FILE)
        return {}
    # through JSON, so that tuples and lists compare as saved
    old, new = (flatten(json.loads(json.dumps(config, default=str))) for config in (saved, current))
    missing = "<absent>"
    changes = {key: (old.get(key, missing), new.get(key, missing)) for key in sorted(old.keys() | new.keys())
               if key not in RESUME_KEYS and old.get(key, missing) != new.get(key, missing)}
    if changes:
        listing = "\n".join(f"  {key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())
        logger.warning(
            "resuming from %s with %d setting(s) changed since it was saved; this run's values apply "
            "(optimizer settings included; the weights, optimizer moments, schedule position and data "
            "position come from the checkpoint):\n%s", step_dir, len(changes), listing)
    return changes
