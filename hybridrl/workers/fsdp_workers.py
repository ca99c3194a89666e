"""The SPMD workers the trainer drives: actor + rollout + reference in one process, and the critic. Each
registered method is one rank's work on its share of a batch, split and merged as its dispatch mode says."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import torch

from hybridrl.controller import Dispatch, Execute, Worker, register
from hybridrl.controller.worker import node_address
from hybridrl.models.loading import load_tokenizer, load_value_model, resolve_dtype
from hybridrl.models.lora import LoRASettings, add_lora
from hybridrl.protocol import DataProto
from hybridrl.tools.base_tool import load_all_tools
from hybridrl.tools.interaction import load_interactions
from hybridrl.utils.metric import (
    FORWARD_FLOPS_PER_PARAM,
    TRAIN_FLOPS_PER_PARAM,
    ModelPass,
    device_peak_flops,
    matmul_params,
    report_worker_seconds,
)
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.checkpoint import CheckpointManager
from hybridrl.workers.config import (
    ActorRolloutRefConfig,
    CriticConfig,
    actor_sequence_parallel,
    critic_sequence_parallel,
    to_dataclass,
)
from hybridrl.workers.critic import PPOCritic
from hybridrl.workers.fsdp_engine import FSDPEngine, load_model_for, offload_refusals, refuse_offload
from hybridrl.workers.rollout import ROLLOUT_ENGINES, build_rollout
from hybridrl.workers.rollout.agent_loop import AgentLoop
from hybridrl.workers.update_loop import (
    check_actor_rollout_ref,
    check_critic,
    log_prob_batching,
    update_plan,
    value_batching,
)
from hybridrl.workers.weight_sync import (
    BucketPlan,
    SyncGroup,
    host_store,
    receive_weights,
    send_weights,
    weight_manifest,
)

ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")


def forward_and_update_passes(model: torch.nn.Module, fsdp_dtype: str, epochs: int, infer: str,
                              train: str) -> dict[str, ModelPass]:
    """A trained model's passes for MFU: the no-grad forward (`infer`) and the update (`train`)."""
    params = matmul_params(model)
    return {infer: forward_pass(params, fsdp_dtype),
            train: forward_pass(params, fsdp_dtype, TRAIN_FLOPS_PER_PARAM, epochs)}


def forward_pass(params: int, dtype: str, flops_per_param: int = FORWARD_FLOPS_PER_PARAM,
                 passes: int = 1) -> ModelPass:
    """A no-grad forward (or with `TRAIN_FLOPS_PER_PARAM`, an update) of a model with `params` matmul
    parameters, computing in `dtype`."""
    return ModelPass(params, flops_per_param, passes, device_peak_flops(resolve_dtype(dtype)))


class TrainingWorker(Worker):
    """What the actor's and the critic's workers share: the MFU passes and verl's checkpoint calls."""

    passes: dict[str, ModelPass]  # filled by init_model
    checkpoint_manager: CheckpointManager

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def model_passes(self) -> dict[str, ModelPass]:
        """As the role has them: `rollout`, `actor_infer`, `actor` and `ref`; `critic_infer` and `critic`."""
        return dict(self.passes)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        """Save the model, optimizer, scheduler and RNG to `local_path` (a `.../actor` or `.../critic` directory)."""
        manager = self._checkpoint_manager("save_checkpoint", hdfs_path)
        manager.save_checkpoint(local_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        self._checkpoint_manager("load_checkpoint", hdfs_path).load_checkpoint(local_path)

    def _checkpoint_manager(self, method: str, hdfs_path: str | None) -> CheckpointManager:
        if hdfs_path:
            raise NotImplementedError(
                f"copying checkpoints to HDFS ({hdfs_path}) is not supported; keep trainer.default_hdfs_dir unset "
                f"and sync trainer.default_local_dir yourself"
            )
        return self.checkpoint_manager


class ActorRolloutRefWorker(TrainingWorker):
    """Actor, rollout and/or reference policy on one rank, by `role`. With `actor_rollout[_ref]` the rollout
    generates with the actor's current weights
    (docs/rollout.md, "The hand-off between training and generation").
    A LoRA actor's reference policy is its base with the adapters disabled (no second model)."""

    def __init__(self, config: Any, role: str) -> None:
        self.config = to_dataclass(ActorRolloutRefConfig, config)
        super().__init__(collective_timeout_s=self.config.nccl_timeout)
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if role != "rollout":  # the batch arithmetic is the training ranks'; a rollout pool only generates
            check_actor_rollout_ref(self.config, self.world_size)
        self.role = role
        self.is_actor, self.is_rollout, self.is_ref = "actor" in role, "rollout" in role, "ref" in role
        self.lora = LoRASettings.from_model_config(self.config.model)
        self.actor = self.ref = self.rollout = None
        self.agent_loop: AgentLoop | None = None  # rollout.multi_turn.enable: multi-turn generation with tools
        self.rollout_weights: FSDPEngine | None = None  # the engine whose weights the rollout serves
        # a rollout pool of its own: the sync group's end and the version of the weights it last received
        self.weight_sync: SyncGroup | None = None
        self.weight_sync_store: Any = None  # the actor's rank 0 hosts the sync group's store
        self.weight_version: int | None = None
        device_type = self.device.type
        if self.is_actor:
            refuse_offload(actor_offload_refusals(self.config, role, device_type))
        if self.is_ref:
            refuse_offload(offload_refusals(self.config.ref.fsdp_config, "actor_rollout_ref.ref", device_type))
        self.passes = {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        actor_sp, ref_sp = actor_sequence_parallel(cfg)
        actor_dtype = cfg.actor.fsdp_config.mixed_precision.param_dtype
        ref_dtype = cfg.ref.fsdp_config.mixed_precision.param_dtype
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path,
                                        trust_remote_code=cfg.model.trust_remote_code)
        # the peaks of the passes below, measured in turns across ranks; the passes read them cached
        self.measure_peak_flops(resolve_dtype(name) for name, needed in (
            (actor_dtype, self.is_actor), (cfg.rollout.dtype, self.is_rollout), (ref_dtype, self.is_ref),
        ) if needed)
        if self.is_actor:
            model = load_model_for(cfg.model, cfg.model.enable_gradient_checkpointing, actor_dtype, self.device.type,
                                   weights_dtype=cfg.actor.fsdp_config.model_dtype)
            if self.lora.enabled:  # the frozen base in the compute dtype
                model = add_lora(model, self.lora, base_dtype=resolve_dtype(actor_dtype))
            self.passes.update(forward_and_update_passes(model, actor_dtype, cfg.actor.ppo_epochs,
                                                         infer="actor_infer", train="actor"))
            engine = FSDPEngine(model, cfg.actor.fsdp_config, cfg.actor.optim, cfg.actor.grad_clip,
                                sequence_parallel_size=actor_sp,
                                sequence_parallel_key="actor_rollout_ref.actor.ulysses_sequence_parallel_size")
            self.actor = PPOActor(cfg.actor, engine, share_prompts=cfg.model.share_prompt_forward)
            self.checkpoint_manager = CheckpointManager(engine, self.tokenizer, cfg.actor.checkpoint,
                                                        base_model_path=cfg.model.path)
        if self.is_rollout:
            rollout_cfg = dataclasses.replace(cfg.rollout, seed=cfg.rollout.seed + self.rank)
            module = None
            if self.actor:
                self.rollout_weights, params = self.actor.engine, self.passes["actor"].params
                module = self.rollout_weights.module
            else:  # a rollout pool of its own: a whole copy per rank, LoRA merged in by every weight sync
                model = load_model_for(cfg.model, False, cfg.rollout.dtype, self.device.type,
                                       weights_dtype=resolve_dtype(cfg.rollout.dtype))
                params = matmul_params(model)
                if not ROLLOUT_ENGINES.get(cfg.rollout.name).holds_own_weights:  # HF generates with the module
                    module = model.to(self.device)
                del model
            self.rollout = build_rollout(rollout_cfg, module=module, tokenizer=self.tokenizer,
                                         model_path=cfg.model.path)
            multi_turn = cfg.rollout.multi_turn
            if multi_turn.enable:
                tools = load_all_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
                interactions = load_interactions(multi_turn.interaction_config_path) \
                    if multi_turn.interaction_config_path else {}
                self.agent_loop = AgentLoop(self.rollout, self.tokenizer, rollout_cfg, tools, interactions)
            self.passes["rollout"] = forward_pass(params, cfg.rollout.dtype)
        if self.is_ref and self.actor and self.actor.engine.has_lora:  # the base under the actor's adapters
            self.passes["ref"] = forward_pass(self.passes["actor"].params, actor_dtype)
            self.ref = self.actor
        elif self.is_ref:
            model = load_model_for(cfg.model, False, ref_dtype, self.device.type,
                                   weights_dtype=cfg.ref.fsdp_config.model_dtype)
            self.passes["ref"] = forward_pass(matmul_params(model), ref_dtype)
            engine = FSDPEngine(model, cfg.ref.fsdp_config, sequence_parallel_size=ref_sp,
                                sequence_parallel_key="actor_rollout_ref.ref.ulysses_sequence_parallel_size")
            self.ref = PPOActor(cfg.actor, engine, share_prompts=cfg.model.share_prompt_forward)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @report_worker_seconds
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self._require(self.rollout, "generate_sequences", "rollout")
        step_seed = prompts.meta_info.get("seed")
        if step_seed is not None:  # a per-step seed from the trainer: distinct streams per rank
            prompts.meta_info["seed"] = int(step_seed) * 1009 + self.rank
        # every turn of a multi-turn rollout samples inside the one hand-off block
        generator = self.agent_loop or self.rollout
        with self.rollout.serving(self.rollout_weights):  # the hand-off: the current weights, offload
            output = generator.generate_sequences(prompts)
        output.meta_info.setdefault("temperature", self.config.rollout.temperature)
        if self.weight_version is not None:  # a rollout pool of its own: which update its weights came from
            output.meta_info["weight_version"] = self.weight_version
        # concatenating the ranks' outputs needs equal meta_info: the step's seed, not this rank's stream
        if step_seed is not None:
            output.meta_info["seed"] = step_seed
        return output

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def stream_generate(self, prompts: DataProto | None, max_steps: int, partial: bool) -> DataProto | None:
        """Streaming mode: add the prompts to this rank's continuous batch and decode until a prompt has all its
        samples (or `max_steps` tokens); returns the finished groups (hybridrl/workers/rollout/continuous.py)."""
        self._require(self.rollout, "stream_generate", "rollout")  # the HF engine: placement_errors refuses others
        with self.rollout.serving(self.rollout_weights):
            return self.rollout.stream(prompts, self.weight_version or 0, max_steps, 1, partial)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_unfinished(self) -> DataProto | None:
        """Streaming mode: the prompts in this rank's continuous batch, admitted or waiting, not finished."""
        self._require(self.rollout, "stream_unfinished", "rollout")
        batch = self.rollout.continuous
        return None if batch is None else batch.unfinished_prompts()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @report_worker_seconds
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs`, `entropys` and (actor.calculate_sum_pi_squared) `sum_pi_squared` of the responses."""
        self._require(self.actor, "compute_log_prob", "actor")
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        rows, tokens = log_prob_batching(self.config.rollout, self.world_size)
        outputs = self.actor.compute_response_outputs(
            data, rows, tokens, calculate_entropy=True,
            calculate_sum_pi_squared=self.config.actor.calculate_sum_pi_squared)
        names = {"log_probs": "old_log_probs", "entropy": "entropys"}  # verl's column names
        return DataProto.from_dict({names.get(k, k): v for k, v in outputs.items()},
                                   meta_info={"temperature": data.meta_info["temperature"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @report_worker_seconds
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        self._require(self.ref, "compute_ref_log_prob", "ref")
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        rows, tokens = log_prob_batching(self.config.ref, self.world_size)
        # a LoRA actor is its own reference policy with the adapters disabled
        base_only = self.actor.engine.adapters_disabled() if self.ref is self.actor else contextlib.nullcontext()
        with base_only:
            log_probs, _ = self.ref.compute_log_prob(data, rows, tokens)
        return DataProto.from_dict({"ref_log_prob": log_probs})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @report_worker_seconds
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update on this rank's rows; metrics (averaged over ranks) in meta_info. With
        meta_info["fuse_old_log_prob"] it also returns the `old_log_probs` of its own forward."""
        self._require(self.actor, "update_actor", "actor")
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        plan = update_plan(self.config.actor, self.config.rollout.n, self.world_size)
        if data.meta_info.get("fuse_old_log_prob", False):
            metrics, old_log_probs = self.actor.update_policy_fused(data, plan)
            return DataProto.from_dict({"old_log_probs": old_log_probs}, meta_info={"metrics": metrics})
        metrics = self.actor.update_policy(data, plan)
        return DataProto(meta_info={"metrics": metrics})

    def _checkpoint_manager(self, method: str, hdfs_path: str | None) -> CheckpointManager:
        self._require(self.actor, method, "actor")
        return super()._checkpoint_manager(method, hdfs_path)

    # ----- the weight sync between a training pool and a rollout pool (hybridrl/workers/weight_sync.py) ------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_manifest(self) -> list[tuple[str, tuple[int, ...]]] | None:
        """(name, shape) of the actor's full weights in sync order, on rank 0 (a collective: it gathers each)."""
        self._require(self.actor, "weight_manifest", "actor")
        manifest = weight_manifest(self.actor.engine.iter_full_weights())
        return manifest if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_weight_spec(self) -> dict[str, Any]:
        """What this rollout takes: `dtype` (rollout.dtype as resolved on its device) and `shapes` (name -> shape,
        where the engine says: HF's module; None where the engine checks the names itself, as vLLM does)."""
        self._require(self.rollout, "rollout_weight_spec", "rollout")
        module = getattr(self.rollout, "module", None)
        shapes = None if module is None else {name: tuple(t.shape) for name, t in module.state_dict().items()}
        return {"dtype": str(resolve_dtype(self.config.rollout.dtype)).removeprefix("torch."), "shapes": shapes}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def host_weight_sync(self) -> tuple[str, int]:
        """The actor's rank 0: host the sync group's store; returns its (node address, port)."""
        self._require(self.actor, "host_weight_sync", "actor")
        self.weight_sync_store, port = host_store()
        return node_address(), port

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_sync(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Join the sync group: the actor's rank 0 as rank 0, rollout rank r as r + 1 (other actor ranks stay out)."""
        if self.is_actor and self.rank == 0:
            self.weight_sync = SyncGroup.join(host, port, 0, world_size, self.device, timeout_s,
                                              store=self.weight_sync_store)
        elif self.is_rollout and not self.is_actor:
            self.weight_sync = SyncGroup.join(host, port, self.rank + 1, world_size, self.device, timeout_s)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, plan: BucketPlan, version: int) -> dict[str, float]:
        """Gather the actor's weights (every rank) and broadcast them from rank 0 to the rollout pool."""
        self._require(self.actor, "send_weights", "actor")
        start = time.perf_counter()
        sent = send_weights(self.actor.engine.iter_full_weights(), plan, self.weight_sync)
        return {"bytes": float(sent), "seconds": time.perf_counter() - start, "version": float(version)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, plan: BucketPlan, version: int) -> dict[str, float]:
        """Take the weights the actor's rank 0 broadcasts into this rollout's engine; they are `version` from now."""
        self._require(self.rollout, "receive_weights", "rollout")
        if self.weight_sync is None:
            raise RuntimeError("receive_weights before join_weight_sync: the driver joins the sync group first")
        start = time.perf_counter()
        self.rollout.receive_weights(receive_weights(plan, self.weight_sync))
        self.weight_version = version
        return {"seconds": time.perf_counter() - start, "version": float(version)}

    def _require(self, part: Any, method: str, needs: str) -> None:
        if part is None:
            raise RuntimeError(
                f"{method} needs the {needs} part, but this worker has role {self.role!r}; "
                f"call init_model first or use a role that includes {needs!r}"
            )


class CriticWorker(TrainingWorker):
    """The value model (GAE): `compute_values` and `update_critic` on this rank's rows."""

    def __init__(self, config: Any) -> None:
        self.config = to_dataclass(CriticConfig, config)
        super().__init__(collective_timeout_s=self.config.nccl_timeout)
        check_critic(self.config, self.world_size)
        refuse_offload(offload_refusals(self.config.model.fsdp_config, "critic.model", self.device.type))
        self.critic = None
        self.passes = {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_cfg = self.config.model
        dtype = model_cfg.fsdp_config.mixed_precision.param_dtype
        model = load_model_for(model_cfg, model_cfg.enable_gradient_checkpointing, dtype, self.device.type,
                               loader=load_value_model,
                               weights_dtype=model_cfg.fsdp_config.model_dtype)
        self.tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path,
                                        trust_remote_code=model_cfg.trust_remote_code)
        self.measure_peak_flops([resolve_dtype(dtype)])  # in turns across ranks; read cached just below
        self.passes = forward_and_update_passes(model, dtype, self.config.ppo_epochs, infer="critic_infer",
                                                train="critic")
        engine = FSDPEngine(model, model_cfg.fsdp_config, self.config.optim, self.config.grad_clip,
                            sequence_parallel_size=critic_sequence_parallel(self.config),
                            sequence_parallel_key="critic.ulysses_sequence_parallel_size")
        self.critic = PPOCritic(self.config, engine, share_prompts=model_cfg.share_prompt_forward)
        self.checkpoint_manager = CheckpointManager(engine, self.tokenizer, self.config.checkpoint)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @report_worker_seconds
    def compute_values(self, data: DataProto) -> DataProto:
        rows, tokens = value_batching(self.config, self.world_size)
        return DataProto.from_dict({"values": self.critic.compute_values(data, rows, tokens)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @report_worker_seconds
    def update_critic(self, data: DataProto) -> DataProto:
        metrics = self.critic.update_critic(data, update_plan(self.config, self.config.rollout_n, self.world_size))
        return DataProto(meta_info={"metrics": metrics})


def actor_offload_refusals(cfg: ActorRolloutRefConfig, role: str, device_type: str) -> list[str]:
    """Refusals of the actor's offload keys where they would be silently ignored: they act in the rollout
    hand-off only (`param_offload` only with an engine that has weights of its own, vLLM)."""
    offload = cfg.actor.fsdp_config
    if "rollout" not in role:
        return offload_refusals(offload, "actor_rollout_ref.actor", device_type)  # no rollout, no hand-off
    if offload.param_offload and device_type != "cpu" and not ROLLOUT_ENGINES.get(cfg.rollout.name).holds_own_weights:
        return [
            "actor_rollout_ref.actor.fsdp_config.param_offload=true is not supported with "
            f"rollout.name={cfg.rollout.name!r}, which generates with the actor's own parameters: they leave "
            "the device only while a rollout engine with its own copy of the weights (rollout.name=vllm) "
            "generates. Set it to false."
        ]
    return []
