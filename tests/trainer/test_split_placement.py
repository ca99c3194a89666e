"""GRPO with the rollout on a pool of its own (actor_rollout_ref.hybrid_engine=false): the weights reach the
rollout exactly and on time, the split run trains the colocated run's policy, resume works with the same
placement, a dead rollout process stops the run naming it, and a reward model on its own pool scores alike."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from ppo_helpers import ppo_config, random_reward_model, tiny_run_overrides
from test_ppo_e2e import DETERMINISTIC

from hybridrl.controller.ray import WorkerDiedError
from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

ONE_PROCESS = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.calculate_log_probs=true"]
SPLIT = [*ONE_PROCESS, "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1"]


def test_split_grpo_syncs_every_update_trains_as_colocated_and_resumes(arithmetic_data, tiny_model_dir, tmp_path):
    base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "split")
    # buckets of 1 MB: the 4 MB model travels in several
    split = run_ppo(ppo_config(*base, *SPLIT, "trainer.total_training_steps=3", "trainer.save_freq=2",
                               "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
                               "trainer.test_freq=2"))
    assert [m["training/global_step"] for m in split] == [1, 2, 3]
    assert "val-core/arithmetic/reward/mean@1" in split[1]  # validation generates on the rollout pool too
    for step, metrics in enumerate(split, start=1):
        # the rollout sampled with the weights of the update just before (fp32: rounding only)
        assert metrics["rollout/log_prob_diff_max"] <= 1e-5, (step, metrics["rollout/log_prob_diff_max"])
        assert metrics["rollout/weight_version"] == step - 1 and metrics["rollout/weight_staleness"] == 0
        assert metrics["perf/weight_sync_bytes"] == split[0]["perf/weight_sync_bytes"] > 4e6  # fp32 weights
        assert metrics["timing_s/weight_sync"] > 0 and metrics["perf/weight_sync_gbps"] > 0

    # the same seeds and weights on one colocated process: the same samples, losses and updates, to the bit (the
    # synced weights are the actor's exactly, and the rollout process decodes as the colocated one does)
    colocated = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "colocated"),
                                   *ONE_PROCESS, "trainer.total_training_steps=3", "trainer.test_freq=2"))
    for key in [*DETERMINISTIC, "val-core/arithmetic/reward/mean@1"]:
        assert [m.get(key) for m in split] == [m.get(key) for m in colocated], key

    # resume from step 2's checkpoint with the same placement: the rollout pool gets the resumed weights
    resumed_dir = tmp_path / "resumed"
    again = tiny_run_overrides(arithmetic_data, tiny_model_dir, resumed_dir)
    run_ppo(ppo_config(*again, *SPLIT, "trainer.total_training_steps=2", "trainer.save_freq=2"))
    resumed = run_ppo(ppo_config(*again, *SPLIT, "trainer.total_training_steps=3", "trainer.save_freq=2"))
    assert [m["training/global_step"] for m in resumed] == [3]
    assert resumed[0]["rollout/weight_version"] == 2
    for key in DETERMINISTIC:
        assert resumed[0][key] == split[2][key], key


def _kill_rollout_after_checkpoint(run_dir: Path, killed: dict) -> None:
    """Wait for the first committed checkpoint, then SIGKILL the rollout pool's process."""
    import ray

    deadline = time.monotonic() + 120
    while not (run_dir / "latest_checkpointed_iteration.txt").exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rollout_pool")]
    actor = ray.get_actor(names[0], namespace=next(a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
                                                   if a["name"] == names[0]))
    pid = ray.get(actor.process_info.remote())["pid"]
    killed["at"] = time.monotonic()
    os.kill(pid, signal.SIGKILL)


def test_a_killed_rollout_process_stops_the_run_naming_it_and_the_run_resumes(arithmetic_data, tiny_model_dir,
                                                                               tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*tiny_run_overrides(arithmetic_data, tiny_model_dir, run_dir), *SPLIT, "trainer.save_freq=1"]
    killed: dict = {}
    killer = threading.Thread(target=_kill_rollout_after_checkpoint, args=(run_dir, killed))
    killer.start()
    # the driver's own wait names the dead process (a collective waiting on it would time out after
    # actor_rollout_ref.nccl_timeout, 600 s, with another error)
    with pytest.raises(WorkerDiedError, match=r"rank 0 of pool 'rollout_pool'"):
        run_ppo(ppo_config(*overrides, "trainer.total_training_steps=200"))
    print(f"the run stopped {time.monotonic() - killed['at']:.1f} s after the kill")
    killer.join()
    assert "at" in killed

    last = int((run_dir / "latest_checkpointed_iteration.txt").read_text())
    resumed = run_ppo(ppo_config(*overrides, f"trainer.total_training_steps={last + 1}"))
    assert [m["training/global_step"] for m in resumed] == [last + 1]
    assert resumed[0]["rollout/weight_version"] == last and resumed[0]["rollout/log_prob_diff_max"] <= 1e-5


def test_a_reward_model_on_its_own_pool_scores_as_colocated(arithmetic_data, tiny_model_dir, tmp_path):
    rm_dir = random_reward_model(tiny_model_dir, tmp_path / "rm")
    rm = ["reward_model.enable=true", f"reward_model.model.path={rm_dir}", "trainer.total_training_steps=1"]
    runs = {}
    for name, pool in (("colocated", []), ("own_pool", ["reward_model.enable_resource_pool=true",
                                                         "reward_model.nnodes=1", "reward_model.n_gpus_per_node=1"])):
        runs[name] = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / name),
                                        *ONE_PROCESS, *rm, *pool))[0]
    for key in ("critic/score/mean", "critic/score/max", "critic/score/min"):
        assert runs["own_pool"][key] == runs["colocated"][key], key
    assert runs["own_pool"]["critic/score/max"] > runs["own_pool"]["critic/score/min"]  # the model scored


def test_a_lora_actor_sends_the_rollout_pool_its_merged_weights(arithmetic_data, tiny_model_dir, tmp_path):
    history = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "lora"), *SPLIT,
                                 "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.optim.lr=1e-2",
                                 "trainer.total_training_steps=3"))
    # the rollout holds a plain model: the adapters, trained away from zero, arrive merged into the weights
    assert max(m["rollout/log_prob_diff_max"] for m in history) <= 1e-5
    assert history[-1]["actor/kl_loss"] > 0


def test_pools_the_cluster_cannot_hold_together_are_refused_at_once_naming_each(arithmetic_data, tiny_model_dir,
                                                                                 tmp_path):
    # refused before any pool starts: not after a placement group's wait for resources the first pool holds
    with pytest.raises(RuntimeError, match=r"need 3 processes x 1 CPU = 3 CPUs \(global_pool 1 x 2, rollout_pool "
                                           r"1 x 1\) but the Ray cluster has 2"):
        run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run"),
                           "actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=2",
                           "rollout.n_gpus_per_node=1"))
