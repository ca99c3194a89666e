"""The hybrid-engine hand-off through the worker, for both engines: after every update the rollout
generates with the actor's current weights, and the offload settings act inside the hand-off (and
fail, naming the key, for every model the hand-off does not serve).

The vLLM case runs where the vllm package is importable (the CPU build lives in its own venv:
requirements-vllm.txt) and is skipped, with that reason, everywhere else.
"""

import functools
import importlib.util
import re

import pytest
import torch
from batches import rollout_batch

from hybridrl.controller import ClassWithInitArgs, LocalWorkerGroup
from hybridrl.protocol import DataProto
from hybridrl.trainer.config_rules import offload_errors
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.workers.config import ActorRolloutRefConfig, to_dataclass
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, actor_offload_refusals

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = "vllm is not installed: the CPU build runs in its own venv (requirements-vllm.txt)"
ENGINES = ["hf", pytest.param("vllm", marks=pytest.mark.skipif(not HAS_VLLM, reason=NO_VLLM))]

# What the hand-off does to the actor's engine around one generation, in order. The HF engine reads the
# gathered module in place; vLLM receives the full weights, then the actor's parameters may leave the
# device while vLLM generates from its copy. Offload moves nothing on CPU; the order is what is checked.
HAND_OFF_CALLS = {
    "hf": ["offload_optimizer", "summon_full_params", "load_optimizer"],
    "vllm": ["offload_optimizer", "iter_full_weights", "offload_params", "load_params", "load_optimizer"],
}


def worker_config(model_dir, engine: str, **fsdp) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 4, "optim": {"lr": 1e-3},
                  "fsdp_config": fsdp},
        "rollout": {"name": engine, "n": 2, "prompt_length": 10, "response_length": 12, "temperature": 0.7,
                    "log_prob_micro_batch_size_per_gpu": 8},
    }


def prompts() -> DataProto:
    batch = rollout_batch(rows=4).select(batch_keys=["input_ids", "attention_mask", "position_ids"])
    for key in ("input_ids", "attention_mask", "position_ids"):
        batch.batch[key] = batch.batch[key][:, :10]
    return batch


def log_prob_gap(group: LocalWorkerGroup, gen: DataProto) -> tuple[float, torch.Tensor]:
    """max |rollout - actor| log-prob over the response tokens, and the actor's log-probs."""
    recomputed = group.call("compute_log_prob", gen).batch["old_log_probs"]
    mask = gen.batch["response_mask"].bool()
    return float((recomputed - gen.batch["rollout_log_probs"])[mask].abs().max()), recomputed


def update(group: LocalWorkerGroup, gen: DataProto, old_log_probs: torch.Tensor) -> None:
    gen.batch["old_log_probs"] = old_log_probs
    gen.batch["advantages"] = torch.linspace(-1, 1, len(gen))[:, None] * gen.batch["response_mask"]
    group.call("update_actor", gen)


def record_calls(engine, names) -> list[str]:
    calls: list[str] = []
    for name in names:
        original = getattr(engine, name)

        def recorded(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(engine, name, recorded)
    return calls


@pytest.mark.parametrize("engine", ENGINES)
def test_the_rollout_generates_with_the_updated_actor(engine, tiny_model_dir):
    offload = {"optimizer_offload": True, "param_offload": engine == "vllm"}
    group = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, worker_config(tiny_model_dir, engine,
                                                                                    **offload), "actor_rollout"))
    try:
        group.call("init_model")
        worker = group.worker
        calls = record_calls(worker.actor.engine, {name for names in HAND_OFF_CALLS.values() for name in names})
        batch = prompts()
        for _ in range(3):  # before any update and after each: the sampler's policy is the trained one
            gen = group.call("generate_sequences", batch)
            gap, recomputed = log_prob_gap(group, gen)
            assert gap < 1e-5
            update(group, gen, recomputed)
        # one call site, the same hand-off at every generation
        assert calls == HAND_OFF_CALLS[engine] * 3
        if engine == "vllm":
            # Without the hand-off vLLM samples from the weights it last received: after the update
            # above they are stale, and the rollout/trainer log-prob gap shows it.
            stale = worker.rollout.generate_sequences(batch)
            assert log_prob_gap(group, stale)[0] > 1e-3
    finally:
        group.shutdown()


def test_param_offload_needs_an_engine_with_its_own_weights():
    # The HF engine generates with the actor's parameters, so on an accelerator they cannot leave the
    # device for it: the key is refused instead of being ignored. vLLM has its own copy; on a CPU the
    # parameters are in host memory already, which is what the key asks for.
    def refusals(engine: str, device: str) -> list[str]:
        config = to_dataclass(ActorRolloutRefConfig, worker_config("/m", engine, param_offload=True))
        return actor_offload_refusals(config, "actor_rollout", device)

    (message,) = refusals("hf", "cuda")
    assert re.search(r"actor_rollout_ref\.actor\.fsdp_config\.param_offload=true .*rollout.name='hf'", message)
    assert refusals("vllm", "cuda") == [] and refusals("hf", "cpu") == []


OUTSIDE_THE_HAND_OFF = [
    # an actor without a rollout has no hand-off to offload in
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "actor"),
    ("actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref"),
    ("critic.model.fsdp_config.optimizer_offload", None),
    ("reward_model.model.fsdp_config.param_offload", None),
]


@pytest.mark.parametrize("key, role", OUTSIDE_THE_HAND_OFF)
def test_offload_outside_the_hand_off_is_refused_on_an_accelerator_before_any_worker_starts(key, role):
    """Only the actor's rollout hand-off moves state off the device; elsewhere the keys would do nothing
    on a GPU. The trainer's check (`offload_errors`, run by resolve_config before Ray) names the key; the
    workers run the same check for themselves (`refuse_offload`)."""
    # a run that has every role: GAE (critic), a KL loss (reference), a reward model
    if role == "actor":  # an actor without a rollout is not a trainer role: the worker's own rule
        config = to_dataclass(ActorRolloutRefConfig, worker_config("/m", "hf", optimizer_offload=True))
        (message,) = actor_offload_refusals(config, "actor", "cuda")
        assert message.startswith(f"{key}=true is not supported on cuda")
        assert actor_offload_refusals(config, "actor", "cpu") == []
        return
    config = PPOTrainerConfig()
    config.algorithm.adv_estimator, config.actor_rollout_ref.actor.use_kl_loss = "gae", True
    config.reward_model.enable = True
    *section, name = key.split(".")
    setattr(functools.reduce(getattr, section, config), name, True)
    config.trainer.device = "cuda"
    (message,) = offload_errors(config)
    assert message.startswith(f"{key}=true is not supported on cuda") and "Set it to false" in message
    config.trainer.device = "cpu"
    assert offload_errors(config) == []


def test_offload_keys_on_a_cpu_keep_the_state_in_host_memory(tiny_model_dir):
    # verl scripts offload the reference model (ref.fsdp_config.param_offload=true): on a CPU the worker
    # accepts it, and its parameters are where the key asks, in host memory.
    config = {**worker_config(tiny_model_dir, "hf"), "ref": {"fsdp_config": {"param_offload": True}}}
    group = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, config, "actor_rollout_ref"))
    try:
        group.call("init_model")
        assert all(p.device.type == "cpu" for p in group.worker.ref.engine.module.parameters())
    finally:
        group.shutdown()
