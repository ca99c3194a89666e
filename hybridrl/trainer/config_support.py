"""verl keys hybridrl accepts but does not implement: a value that asks for the missing feature stops the run.

verl launch scripts set these keys, so the schema keeps them and a script that leaves them at their
defaults runs unchanged. A value that asks for what hybridrl lacks raises before Ray starts, naming the
key, why, and the value that runs; it used to be accepted and ignored. The config-walk test
(tests/trainer/test_config_keys.py) fails on any schema key that no code reads and no table here lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridrl.trainer.config_ranges import in_use, lookup, schema_defaults
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.trainer.worker_groups import actor_role, uses_critic, uses_reference
from hybridrl.utils.typed_config import as_override
from hybridrl.workers.fsdp_engine import offload_refusals
from hybridrl.workers.fsdp_workers import actor_offload_refusals
from hybridrl.workers.reward_model import STRATEGIES


@dataclass(frozen=True)
class Unsupported:
    why: str  # what hybridrl does instead
    runs_with: tuple[Any, ...] | None = None  # the values that run; None: only the schema's default


NO_SEQUENCE_PARALLEL = Unsupported("sequence parallelism (Ulysses) is not implemented; every rank holds whole "
                                   "sequences")
NO_COMPILE = Unsupported("models run eagerly; torch.compile is not wired into the FSDP engine")
ONE_ENGINE = Unsupported("FSDP2 (fully_shard) is the only training engine; megatron is not available",
                         runs_with=STRATEGIES)
NO_HDFS = Unsupported("checkpoints are written to trainer.default_local_dir only; copy them elsewhere yourself")
NO_CUSTOM_DATASET = Unsupported("prompts always load through hybridrl.data.rl_dataset.RLHFDataset; "
                                "a custom dataset class is not supported")

UNSUPPORTED: dict[str, Unsupported] = {
    "actor_rollout_ref.hybrid_engine": Unsupported(
        "the actor, rollout and reference policy always share one process and one set of weights"),
    **{f"{role}.ulysses_sequence_parallel_size": NO_SEQUENCE_PARALLEL
       for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")},
    "actor_rollout_ref.actor.use_torch_compile": NO_COMPILE,
    "actor_rollout_ref.ref.use_torch_compile": NO_COMPILE,
    "actor_rollout_ref.actor.strategy": ONE_ENGINE,
    "actor_rollout_ref.ref.strategy": ONE_ENGINE,
    "critic.strategy": ONE_ENGINE,
    "reward_model.strategy": ONE_ENGINE,
    "data.custom_cls.path": NO_CUSTOM_DATASET,
    "data.custom_cls.name": NO_CUSTOM_DATASET,
    "data.filter_overlong_prompts_workers": Unsupported(
        "prompt lengths are measured in the driver with batched tokenizer calls, not in worker processes"),
    "data.return_raw_input_ids": Unsupported(
        "a reward model with its own tokenizer gets the conversation re-tokenised instead "
        "(reward_model.model.input_tokenizer)"),
    "trainer.default_hdfs_dir": NO_HDFS,
    "trainer.del_local_ckpt_after_load": NO_HDFS,
    "trainer.ray_wait_register_center_timeout": Unsupported(
        "hybridrl's Ray worker groups have no register center to wait for"),
    "ray_init.timeline_json_file": Unsupported("Ray timelines are not dumped; call ray.timeline() yourself"),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": Unsupported(
        "the agent loop keeps every turn's tokens as the model sampled them and never re-renders earlier turns "
        "with another chat template"),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": Unsupported(
        "interactions (a simulated user answering between turns) are not implemented; tools are"),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": Unsupported(
        "multi-turn rollouts are not repeated; rollout.n sets the samples per prompt"),
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": Unsupported(
        "custom agent loops are not supported; the loops are tool_agent and single_turn_agent "
        "(hybridrl/workers/rollout/agent_loop.py)"),
}

# Keys whose every value runs the same way, because hybridrl always does what they ask for.
SAME_EITHER_WAY: dict[str, str] = {
    **{f"{model}.use_remove_padding": "padding columns are always trimmed per micro-batch; flash-attention's "
                                      "padding-free kernels are not used"
       for model in ("actor_rollout_ref.model", "critic.model", "reward_model.model")},
}


def unsupported_errors(config: PPOTrainerConfig) -> list[str]:
    """One message per key set to a value hybridrl cannot run (keys of roles that do not run are skipped)."""
    errors = []
    for key, rule in UNSUPPORTED.items():
        value, default = lookup(config, key), lookup(schema_defaults(), key)
        runs_with = rule.runs_with if rule.runs_with is not None else (default,)
        if in_use(config, key) and value not in runs_with:
            fix = f"set it to {as_override(default)}" if len(runs_with) == 1 else \
                f"set it to one of {', '.join(map(as_override, runs_with))}"
            errors.append(f"{key}={as_override(value)} is not supported by hybridrl: {rule.why}. "
                          f"Remove it or {fix}")
    return errors


def offload_errors(config: PPOTrainerConfig) -> list[str]:
    """`*.fsdp_config.param_offload` / `optimizer_offload` where this run has nothing that moves the state
    (`trainer.device` filled in): the workers' own checks, run before any of them starts."""
    device = config.trainer.device
    errors = actor_offload_refusals(config.actor_rollout_ref, actor_role(config).value, device)
    if uses_reference(config):
        errors += offload_refusals(config.actor_rollout_ref.ref.fsdp_config, "actor_rollout_ref.ref", device)
    if uses_critic(config):
        errors += offload_refusals(config.critic.model.fsdp_config, "critic.model", device)
    if config.reward_model.enable:
        errors += offload_refusals(config.reward_model.model.fsdp_config, "reward_model.model", device)
    return errors
