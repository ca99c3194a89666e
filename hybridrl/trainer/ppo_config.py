"""The PPO/GRPO trainer's typed config: verl's key names, one home for every default.

`ppo_trainer.yaml` composes `PPOTrainerConfig`; `resolve_config` (config_checks.py) checks, fills in and freezes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from hybridrl.algos import get_adv_estimator_spec
from hybridrl.algos.advantage import PF_PPO_METHODS
from hybridrl.algos.rollout_correction import (
    BYPASS_LOSS_TYPES,
    IS_LEVELS,
    parse_is_threshold,
    parse_rs_options,
    rs_option_names,
)
from hybridrl.data.rl_dataset import RLDatasetConfig
from hybridrl.rewards.managers import CustomRewardFunctionConfig
from hybridrl.trainer.command_line import make_paths_absolute
from hybridrl.utils.device import AUTO, auto_dtype, resolve_device_type
from hybridrl.utils.typed_config import ConfigError, FreezableConfig, require
from hybridrl.workers.config import (
    ActorRolloutRefConfig,
    CriticConfig,
    actor_sequence_parallel,
    critic_sequence_parallel,
)
from hybridrl.workers.reward_model import RewardModelConfig
from hybridrl.workers.update_loop import check_sequence_parallel, micro_batch_per_rank

logger = logging.getLogger(__name__)


@dataclass
class CustomClassConfig(FreezableConfig):
    # A .py file or pkg://<importable module>, and the torch Dataset class in it (hybridrl/data/rl_dataset.py,
    # build_rl_dataset); both or neither.
    path: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) != (self.name is None):
            raise ConfigError(f"data.custom_cls.path={self.path} and data.custom_cls.name={self.name}: set both (the "
                              f"file or pkg://module, and the Dataset class in it) or neither")


@dataclass
class SamplerClassConfig(FreezableConfig):
    # A .py file or pkg://<importable module>, and the torch Sampler class in it, built as
    # cls(data_source=dataset, data_config=data); both or neither.
    class_path: str | None = None
    class_name: str | None = None

    def __post_init__(self) -> None:
        if (self.class_path is None) != (self.class_name is None):
            raise ConfigError(f"data.sampler.class_path={self.class_path} and data.sampler.class_name="
                              f"{self.class_name}: set both (the file or pkg://module, and the class in it) or neither")


@dataclass
class DataConfig(RLDatasetConfig):
    # Parquet file(s) in verl's schema; a path or a list of paths.
    train_files: Any = "???"
    val_files: Any = None
    # Tokenizer directory when it differs from the actor's model path.
    tokenizer: str | None = None
    # non_tensor column that selects the reward function (verl's default: data_source).
    reward_fn_key: str = "data_source"
    max_response_length: int = 512
    # Prompts per training step (each sampled rollout.n times).
    train_batch_size: int = 1024
    # verl's prompts per generation round (DAPO, fully_async): a warning names it when set (config_rules.NO_EFFECT)
    gen_batch_size: int | None = None
    # Prompts per validation batch; None validates the whole set in one batch.
    val_batch_size: int | None = None
    shuffle: bool = True
    seed: int = 1
    # Shuffle the validation prompts (seeded by `seed`); the order decides which generations
    # trainer.log_val_generations prints.
    validation_shuffle: bool = False
    dataloader_num_workers: int = 0
    # verl's; only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    return_raw_input_ids: bool = False
    filter_overlong_prompts_workers: int = 1
    # Run code shipped in the tokenizer's directory when the driver loads it (as verl's data.trust_remote_code;
    # the workers' loads follow actor_rollout_ref.model.trust_remote_code, as in verl).
    trust_remote_code: bool = False
    # A prompt dataset class of your own (verl's interface) instead of RLHFDataset.
    custom_cls: CustomClassConfig = field(default_factory=CustomClassConfig)
    # A prompt sampler of your own (verl's interface, e.g. a curriculum; hybridrl/data/sampler.py), instead of
    # the seeded shuffle.
    sampler: SamplerClassConfig = field(default_factory=SamplerClassConfig)


@dataclass
class KLControlConfig(FreezableConfig):
    # fixed | adaptive (Ziegler et al. 2019)
    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class FilterGroupsConfig(FreezableConfig):
    # DAPO dynamic sampling: drop prompts whose samples all score the same on `metric`.
    enable: bool = False
    # acc | score | seq_reward | seq_final_reward (None: seq_final_reward)
    metric: str | None = None
    # Generation rounds allowed to fill one batch; 0 means no limit.
    max_num_gen_batches: int = 0


ROLLOUT_CORRECTION_KEY = "algorithm.rollout_correction"


@dataclass
class RolloutCorrectionConfig(FreezableConfig):
    """`algorithm.rollout_correction`: correct for the rollout engine's policy differing from the trainer's
    (decoupled after the old log-prob pass, or bypass mode inside the loss; docs/algorithms.md)."""

    # IS weight level: token | sequence | None (no weights).
    rollout_is: str | None = None
    # A number truncates the weights at it; "lower_upper" zeroes weights outside the range (IcePop). Write
    # both bounds with a decimal point (0.5_5.0): Hydra reads 1_5 as the number 15, as Python does.
    rollout_is_threshold: Any = 2.0
    # Rescale the weights to mean 1 over the batch.
    rollout_is_batch_normalize: bool = False
    # Comma-separated rejection options (token_k1, seq_mean_k3, ...); None disables rejection.
    rollout_rs: str | None = None
    # One threshold per option (or one for all); a run with rollout_rs set needs it. "lower_upper" as above.
    rollout_rs_threshold: Any = None
    # Skip the old log-prob pass and use the rollout's log-probs as old_log_probs; IS/RS run inside the loss.
    bypass_mode: bool = False
    # The bypass-mode loss: ppo_clip (the actor's policy loss on pi_theta / pi_rollout) | reinforce
    # (-IS weight x A x log pi). Decoupled mode has no use for it.
    loss_type: str = "ppo_clip"

    def __post_init__(self) -> None:
        key = ROLLOUT_CORRECTION_KEY
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            raise ConfigError(f"{key}.rollout_is must be one of {IS_LEVELS} or null, got {self.rollout_is!r}")
        if self.rollout_is is not None:
            if self.rollout_is_threshold is None:
                raise ConfigError(f"{key}.rollout_is={self.rollout_is} needs {key}.rollout_is_threshold "
                                  f"(e.g. 2.0); null would compute no weights")
            _as_config_error(parse_is_threshold, f"{key}.rollout_is_threshold", self.rollout_is_threshold)
        elif self.rollout_is_batch_normalize or self.rollout_is_threshold not in (None, 2.0):
            raise ConfigError(f"{key}.rollout_is_threshold / rollout_is_batch_normalize act only on IS weights; "
                              f"set {key}.rollout_is=token or sequence, or leave them at their defaults")
        if self.rollout_rs is not None and self.rollout_rs_threshold is None:
            # as in verl, a config without the threshold builds; a run asks for it (config_checks.py)
            _as_config_error(rs_option_names, f"{key}.rollout_rs", self.rollout_rs)
        elif self.rollout_rs is not None:
            _as_config_error(parse_rs_options, f"{key}.rollout_rs / rollout_rs_threshold", self.rollout_rs,
                             self.rollout_rs_threshold)
        elif self.rollout_rs_threshold is not None:
            raise ConfigError(f"{key}.rollout_rs_threshold={self.rollout_rs_threshold} acts only with "
                              f"{key}.rollout_rs; set rollout_rs (e.g. token_k1) or remove the threshold")
        if self.loss_type not in BYPASS_LOSS_TYPES:
            raise ConfigError(f"{key}.loss_type must be one of {BYPASS_LOSS_TYPES}, got {self.loss_type!r}")
        if not self.bypass_mode and self.loss_type != "ppo_clip":
            raise ConfigError(f"{key}.loss_type={self.loss_type} acts only in bypass mode; set "
                              f"{key}.bypass_mode=true, or leave loss_type at ppo_clip")

    @property
    def enabled(self) -> bool:
        """Whether the correction computes weights or a rejection mask (decoupled, or in bypass mode's loss)."""
        return self.rollout_is is not None or self.rollout_rs is not None

    @property
    def decoupled(self) -> bool:
        """Whether the trainer corrects the batch between the old log-prob pass and the update."""
        return self.enabled and not self.bypass_mode


def _as_config_error(parse: Any, key: str, *args: Any) -> None:
    """Run a threshold parser; its ValueError becomes a ConfigError that names the key."""
    try:
        parse(*args)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key}: {err}") from None


@dataclass
class PFPPOConfig(FreezableConfig):
    """`algorithm.pf_ppo`: how PF-PPO weighs each response's score when it redraws the batch."""

    # pow (|score|^weight_pow) | max_min (only the best and worst scores) | max_random (best 0.4, rest 0.1)
    reweight_method: str = "pow"
    weight_pow: float = 2.0

    def __post_init__(self) -> None:
        if self.reweight_method not in PF_PPO_METHODS:
            raise ConfigError(f"algorithm.pf_ppo.reweight_method must be one of {PF_PPO_METHODS}, got "
                              f"{self.reweight_method!r}")


@dataclass
class AlgorithmConfig(FreezableConfig):
    gamma: float = 1.0
    lam: float = 1.0
    # A registered advantage estimator: gae, grpo, rloo, reinforce_plus_plus, remax, opo, gpg, ...
    adv_estimator: str = "gae"
    # GRPO: divide by the group's std (False gives Dr. GRPO).
    norm_adv_by_std_in_grpo: bool = True
    # gdpo: the reward components it normalises one by one (extra keys the reward function returns for
    # every row) and their weights (default all 1); hybridrl/algos/advantage.py.
    gdpo_reward_keys: list[str] | None = None
    gdpo_reward_weights: list[float] | None = None
    # Subtract beta * KL(actor || ref) from the token rewards (PPO-style); GRPO uses the actor's kl loss.
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    # PF-PPO: after GAE's advantages, redraw the batch with replacement toward extreme rewards
    # (hybridrl/algos/advantage.py); gae only, as in verl.
    use_pf_ppo: bool = False
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    # IS weights, rejection and bypass mode for the rollout engine's mismatch (RolloutCorrectionConfig).
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class TrainerConfig(FreezableConfig):
    # Reorder rows so each data-parallel rank gets a similar number of tokens.
    balance_batch: bool = True
    total_epochs: int = 30
    # Overrides total_epochs when set; unset, the resolved config holds the training set's whole batches x
    # total_epochs.
    total_training_steps: int | None = None
    project_name: str = "hybridrl"
    experiment_name: str = "run"
    # Any of console, file, tensorboard, wandb, mlflow (a name or a list).
    logger: Any = field(default_factory=lambda: ["console"])
    # Generations printed at each validation.
    log_val_generations: int = 0
    rollout_data_dir: str | None = None
    validation_data_dir: str | None = None
    # Hosts of the Ray cluster: each node's n_gpus_per_node ranks go to a host of their own (docs/multinode.md).
    nnodes: int = 1
    # Worker processes per node (GPUs per node on GPU machines).
    n_gpus_per_node: int = 8
    save_freq: int = -1
    # auto | disable | resume_path
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    val_before_train: bool = True
    val_only: bool = False
    test_freq: int = -1
    # Steps that update only the critic before the actor starts (PPO).
    critic_warmup: int = 0
    # verl's HDFS copies of checkpoints: only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    default_hdfs_dir: str | None = None
    del_local_ckpt_after_load: bool = False
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: int | None = None
    max_critic_ckpt_to_keep: int | None = None
    # Steps in a row with a non-finite loss or gradient norm (updates skipped, never checkpointed) tolerated
    # before the run stops; 0 stops at the first: without fp16 loss scaling a NaN means divergence or NaN data.
    max_consecutive_skipped_steps: int = 0
    # cpu | cuda | auto (cuda when torch sees a GPU, else cpu)
    device: str = "auto"
    # ray (worker processes placed by Ray) | local (one rank inside this process, for debugging)
    backend: str = "ray"
    # Print the resolved config, batch arithmetic and placement, then exit.
    dry_run: bool = False
    # verl's; only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    ray_wait_register_center_timeout: int = 300
    # verl's choice between its two worker implementations; hybridrl has one (config_rules.SAME_EITHER_WAY).
    use_legacy_worker_impl: str = "auto"
    # verl's one-step-off choice between Ray's object store and a process group for the weight sync; hybridrl
    # always moves them through a process group of their own (config_rules.SAME_EITHER_WAY).
    weight_sync_with_ray: bool = True


@dataclass
class RayInitConfig(FreezableConfig):
    # CPUs of a local Ray cluster (None: all cores); ignored when joining a running cluster.
    num_cpus: int | None = None
    # CPUs each worker rank reserves on CPU-only nodes, and the torch threads it computes with. With the
    # default num_cpus the local cluster is sized so that every rank gets them.
    cpus_per_worker: int = 1
    object_store_memory: int | None = 512 * 1024**2
    include_dashboard: bool = False
    # verl's Ray timeline dump; only the default runs in hybridrl (hybridrl/trainer/config_rules.py).
    timeline_json_file: str | None = None


@dataclass
class RolloutPoolConfig(FreezableConfig):
    # The rollout's own pool when actor_rollout_ref.hybrid_engine=false (verl's one-step-off keys): nodes,
    # and processes (GPUs) on each; n_gpus_per_node=0 with the hybrid engine, which has no such pool.
    nnodes: int = 1
    n_gpus_per_node: int = 0
    # verl's fully_async keys, read by async_training.mode=streaming only: the run's length in prompts, its
    # epochs, and validation every test_freq weight syncs (they set trainer.*: _fill_streaming)
    total_rollout_steps: int | None = None
    total_epochs: int | None = None
    test_freq: int | None = None


ASYNC_MODES = ("sync", "one_step_off", "streaming")


@dataclass
class AsyncTrainingConfig(FreezableConfig):
    """`async_training`: whether generation overlaps training: sync, one_step_off or streaming (verl's
    fully_async); docs/placement.md, "One step off", "Streaming"."""

    mode: str = "sync"
    # one_step_off and streaming: correct the older samples with truncated token-level importance weights
    # (algorithm.rollout_correction.rollout_is=token) when algorithm.rollout_correction sets nothing itself
    correct_off_policy: bool = True
    # streaming: the rollout may run ahead by this share of a sync window (0: every sample from the newest
    # weights the window allows)
    staleness_threshold: float = 0.0
    # streaming: training steps between weight syncs to the rollout pool
    trigger_parameter_sync_step: int = 1
    # streaming: mini-batches (actor.ppo_mini_batch_size prompts each) one training step takes
    require_batches: int = 1
    # streaming: rows in flight at a weight sync go on under the new weights (false: they finish first)
    partial_rollout: bool = False
    # one_step_off and streaming: the rollout's log-probs serve as the old ones (algorithm.rollout_correction.
    # bypass_mode=true) instead of the trainer's recomputed ones
    use_rollout_log_probs: bool = False
    compute_prox_log_prob: bool = False
    use_trainer_do_validate: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ASYNC_MODES:
            raise ConfigError(f"async_training.mode must be one of {ASYNC_MODES}, got {self.mode!r} (one_step_off "
                              f"overlaps generation with training a batch ahead; streaming decodes without pause)")


@dataclass
class GlobalProfilerConfig(FreezableConfig):
    # verl's whole-run profiler (nsys, torch, npu); not implemented here: a warning names it when set.
    # Profile a step with benchmarks/profile_step.py instead.
    tool: str | None = None
    steps: list[int] | None = None
    profile_continuous_steps: bool = False
    save_path: str = "outputs/profile"
    global_tool_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class PPOTrainerConfig(FreezableConfig):
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)


# Dicts whose entries are handed on or only warned about: any key may be set in them without verl's `+`.
OPEN_DICTS = (
    *(f"actor_rollout_ref.rollout.engine_kwargs.{engine}" for engine in ("vllm", "sglang", "trtllm")),
    "actor_rollout_ref.rollout.trace", "actor_rollout_ref.rollout.prometheus",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs",
    *(f"{role}.profiler.tool_config" for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")),
    "reward_model.rollout", "reward_model.sandbox_fusion", "reward_model.profiler", "global_profiler.global_tool_config",
    "data.apply_chat_template_kwargs",
)


def _schema_node() -> Any:
    node = OmegaConf.structured(PPOTrainerConfig)
    for key in OPEN_DICTS:
        OmegaConf.set_struct(OmegaConf.select(node, key), False)
    return node


ConfigStore.instance().store(name="ppo_trainer_schema", node=_schema_node())


def world_size(config: PPOTrainerConfig) -> int:
    """Ranks of the one process pool every role of a run shares."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def fill_derived(config: PPOTrainerConfig) -> None:
    """Fill in the settings that follow another key (device, rollout_n, tokenizers, per-rank micro-batches,
    verl's aliases, `auto` dtypes on a CPU, absolute paths), once, inside `resolve_config` before the freeze."""
    make_paths_absolute(config)
    config.trainer.device = resolve_device_type(config.trainer.device)
    n = config.actor_rollout_ref.rollout.n
    for key, node in (("actor_rollout_ref.actor", config.actor_rollout_ref.actor), ("critic", config.critic)):
        require(node.rollout_n in (None, n), f"{key}.rollout_n ({node.rollout_n}) disagrees with "
                f"actor_rollout_ref.rollout.n ({n}); leave {key}.rollout_n unset, it follows rollout.n")
    config.critic.rollout_n = n
    # data.tokenizer is the run's one tokenizer: every worker loads it through its model's tokenizer_path
    tokenizer = config.data.tokenizer
    if tokenizer is not None:
        for key, model in (("actor_rollout_ref.model", config.actor_rollout_ref.model),
                           ("critic.model", config.critic.model)):
            require(model.tokenizer_path in (None, tokenizer),
                    f"data.tokenizer={tokenizer} and {key}.tokenizer_path={model.tokenizer_path} disagree: "
                    f"prompts would be tokenised with one and decoded with the other; set only data.tokenizer")
            model.tokenizer_path = tokenizer
    # the YAML's input_tokenizer (the actor's model directory) means the actor's tokenizer: follow its override
    actor_model, reward_model = config.actor_rollout_ref.model, config.reward_model.model
    if actor_model.tokenizer_path and reward_model.input_tokenizer == actor_model.path:
        reward_model.input_tokenizer = actor_model.tokenizer_path
    _fill_micro_batches_per_rank(config)
    _fill_verl_aliases(config)
    _fill_off_policy_correction(config)
    _fill_streaming(config)
    if config.trainer.device == "cpu":
        arr, on_cpu = config.actor_rollout_ref, str(auto_dtype("cpu")).removeprefix("torch.")
        for fsdp in (arr.actor.fsdp_config, arr.ref.fsdp_config, config.critic.model.fsdp_config,
                     config.reward_model.model.fsdp_config):
            if fsdp.mixed_precision.param_dtype == AUTO:
                fsdp.mixed_precision.param_dtype = on_cpu
        if arr.rollout.dtype == AUTO:
            arr.rollout.dtype = on_cpu


# verl's engines hybridrl does not have; their scripts generate with the hf engine instead
ENGINE_STAND_INS = {"sglang": "hf", "trtllm": "hf"}


def _fill_verl_aliases(config: PPOTrainerConfig) -> None:
    """verl's other names: optim.clip_grad is the role's grad_clip; an engine hybridrl lacks becomes hf."""
    for key, role, clip in (("actor_rollout_ref.actor", config.actor_rollout_ref.actor,
                             config.actor_rollout_ref.actor.optim.clip_grad),
                            ("critic", config.critic, config.critic.optim.clip_grad)):
        if clip is None:
            continue
        require(role.grad_clip in (clip, type(role).grad_clip),
                f"{key}.optim.clip_grad={clip} and {key}.grad_clip={role.grad_clip} disagree; they name one "
                f"setting (verl's and hybridrl's name): set one")
        role.grad_clip = clip
    rollout = config.actor_rollout_ref.rollout
    if rollout.name == "vllm" and config.async_training.mode == "streaming":
        logger.warning("actor_rollout_ref.rollout.name=vllm with async_training.mode=streaming: this run decodes with "
                       "the HF engine's continuous batch, which streaming needs (set rollout.name=hf to silence this, "
                       "or async_training.mode=one_step_off to generate with vLLM)")
        rollout.name = "hf"
    if rollout.name in ENGINE_STAND_INS:
        logger.warning("actor_rollout_ref.rollout.name=%s: hybridrl has no %s engine; this run generates with its "
                       "%s engine, which samples the same distribution (set rollout.name=vllm for vLLM where it is "
                       "installed, or rollout.name=hf to silence this)", rollout.name, rollout.name,
                       ENGINE_STAND_INS[rollout.name])
        rollout.name = ENGINE_STAND_INS[rollout.name]


def _fill_off_policy_correction(config: PPOTrainerConfig) -> None:
    """One step off or streaming: bypass mode with async_training.use_rollout_log_probs, else (unless the
    correction is set or correct_off_policy=false) truncated token-level IS weights."""
    correction, mode = config.algorithm.rollout_correction, config.async_training.mode
    if mode == "sync":
        return
    if config.async_training.use_rollout_log_probs:
        correction.bypass_mode = True
    elif config.async_training.correct_off_policy and not correction.enabled and not correction.bypass_mode:
        correction.rollout_is = "token"
        logger.info("async_training.mode=%s: algorithm.rollout_correction.rollout_is=token (truncated at %s) "
                    "corrects the older samples; async_training.correct_off_policy=false turns it off", mode,
                    correction.rollout_is_threshold)


def _fill_streaming(config: PPOTrainerConfig) -> None:
    """Streaming: data.train_batch_size becomes require_batches x ppo_mini_batch_size prompts; verl's rollout.*
    run length, epochs and validation period (in weight syncs) become the trainer's."""
    async_cfg, trainer = config.async_training, config.trainer
    if async_cfg.mode != "streaming":
        return
    mini, batch = config.actor_rollout_ref.actor.ppo_mini_batch_size, config.data.train_batch_size
    if async_cfg.require_batches == 1 and batch > mini and batch % mini == 0:
        async_cfg.require_batches = batch // mini  # a sync config switched to streaming keeps its step's prompts
    step = async_cfg.require_batches * mini
    require(batch in (0, step), f"async_training.mode=streaming trains async_training.require_batches x "
            f"actor_rollout_ref.actor.ppo_mini_batch_size = {step} prompts a step, but data.train_batch_size="
            f"{batch}: set data.train_batch_size=0 (verl's fully_async) or {step}")
    config.data.train_batch_size = step
    if config.rollout.total_rollout_steps is not None:
        steps = config.rollout.total_rollout_steps // step
        require(steps >= 1, f"rollout.total_rollout_steps={config.rollout.total_rollout_steps} prompts make no step of {step} "
                            f"prompts: raise it to a multiple of {step}")
        logger.info("rollout.total_rollout_steps=%d: trainer.total_training_steps=%d steps of %d prompts",
                    config.rollout.total_rollout_steps, steps, step)
        trainer.total_training_steps = steps
    if config.rollout.total_epochs is not None:
        trainer.total_epochs = config.rollout.total_epochs
    if config.rollout.test_freq is not None:
        trainer.test_freq = config.rollout.test_freq * async_cfg.trigger_parameter_sync_step


def _fill_micro_batches_per_rank(config: PPOTrainerConfig) -> None:
    """Each unset `*_per_gpu` micro-batch key of a role that runs becomes verl's global key over the ranks."""
    arr, critic, rm = config.actor_rollout_ref, config.critic, config.reward_model
    if critic.forward_micro_batch_size_per_gpu is None and critic.forward_micro_batch_size is None:
        # verl's default: the critic's value pass cuts micro-batches as its update does
        critic.forward_micro_batch_size_per_gpu = critic.ppo_micro_batch_size_per_gpu
        critic.forward_micro_batch_size = critic.ppo_micro_batch_size
    keys = [(arr.actor, "actor_rollout_ref.actor.ppo_micro_batch_size"),
            (arr.rollout, "actor_rollout_ref.rollout.log_prob_micro_batch_size"),
            (arr.ref, "actor_rollout_ref.ref.log_prob_micro_batch_size")]
    # a sequence-parallel group shares its rows: verl's global sizes divide among the groups, not the ranks
    actor_sp, ref_sp = actor_sequence_parallel(arr)
    groups = {"actor_rollout_ref.actor": actor_sp, "actor_rollout_ref.ref": ref_sp}
    if get_adv_estimator_spec(config.algorithm.adv_estimator).needs_critic:
        keys += [(critic, "critic.ppo_micro_batch_size"), (critic, "critic.forward_micro_batch_size")]
        groups["critic"] = critic_sequence_parallel(critic)
    for section, size in groups.items():
        check_sequence_parallel(size, world_size(config), f"{section}.ulysses_sequence_parallel_size")
    sequence_parallel = {**groups, "actor_rollout_ref.rollout": actor_sp}  # the log-prob pass is the actor's
    if rm.enable:
        keys.append((rm, "reward_model.micro_batch_size"))
    for node, key in keys:
        section, _, name = key.rpartition(".")
        per_gpu, global_size = getattr(node, f"{name}_per_gpu"), getattr(node, name)
        # checked on the values as set, before the per-rank one is filled in beside the global one
        require(per_gpu is None or global_size is None,
                f"{key}={global_size} and {key}_per_gpu={per_gpu} are both set; set one (the global size is "
                f"divided by the world size)")
        ranks = world_size(config) // sequence_parallel.get(section, 1)  # data-parallel groups
        if node is rm and rm.enable_resource_pool:  # the reward model's own pool divides its batch
            ranks = config.reward_model.nnodes * config.reward_model.n_gpus_per_node or ranks
        setattr(node, f"{name}_per_gpu", micro_batch_per_rank(per_gpu, global_size, ranks, key))


def fill_training_steps(config: PPOTrainerConfig, train_rows: int) -> None:
    """trainer.total_training_steps (unset: whole batches of `train_rows` x total_epochs) and the optimizers'."""
    batch = config.data.train_batch_size
    require(train_rows >= batch, f"the training set has {train_rows} prompts, fewer than data.train_batch_size="
                                 f"{batch}; lower data.train_batch_size or add data")
    steps = config.trainer.total_training_steps or train_rows // batch * config.trainer.total_epochs
    config.trainer.total_training_steps = steps
    for key, optim in (("actor_rollout_ref.actor.optim", config.actor_rollout_ref.actor.optim),
                       ("critic.optim", config.critic.optim)):
        require(optim.total_training_steps in (-1, steps),
                f"{key}.total_training_steps={optim.total_training_steps} disagrees with the run's {steps} steps; "
                f"leave it unset: it follows trainer.total_training_steps (or the data size x trainer.total_epochs)")
        optim.total_training_steps = steps
