"""The workers end to end: a 2-rank Ray group against 1 rank, and the rollout hand-off after updates."""

import pytest
import torch
from batches import rollout_batch
from spmd import run_on_ranks

from hybridrl.controller import ClassWithInitArgs, LocalWorkerGroup
from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from hybridrl.protocol import DataProto
from hybridrl.trainer.metrics import reduce_metrics
from hybridrl.trainer.worker_groups import ActorRolloutRefGroup, CriticGroup
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

pytestmark = pytest.mark.ray


def actor_config(model_dir: str) -> dict:
    return {
        "model": {"path": model_dir},
        "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "optim": {"lr": 1e-3},
                  "use_kl_loss": True, "kl_loss_coef": 0.01},
        "rollout": {"n": 2, "prompt_length": 10, "response_length": 12, "temperature": 0.7,
                    "log_prob_micro_batch_size_per_gpu": 3},
        "ref": {"log_prob_micro_batch_size_per_gpu": 4},
    }


def critic_config(model_dir: str) -> dict:
    return {"model": {"path": model_dir}, "rollout_n": 2, "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": 2, "optim": {"lr": 1e-3}}


def _train_step(wg_actor, wg_critic, data: DataProto) -> dict:
    """One update of each model on a fixed batch, then the log-probs and values they give afterwards."""
    data = data.select(deepcopy=True)
    data.batch["values"] = wg_critic.compute_values(data).batch["values"]
    data.batch["returns"] = data.batch["advantages"] + data.batch["values"]
    actor_metrics = wg_actor.update_actor(data).meta_info["metrics"]
    critic_metrics = wg_critic.update_critic(data).meta_info["metrics"]
    return {
        "log_probs": wg_actor.compute_log_prob(data).batch["old_log_probs"],
        "ref": wg_actor.compute_ref_log_prob(data).batch["ref_log_prob"],
        "values": wg_critic.compute_values(data).batch["values"],
        "actor": actor_metrics, "critic": critic_metrics,
    }


def _single_rank_reference(rank, world_size, model_dir):
    actor = ActorRolloutRefGroup(LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, actor_config(model_dir),
                                                                     "actor_rollout_ref")))
    critic = CriticGroup(LocalWorkerGroup(ClassWithInitArgs(CriticWorker, critic_config(model_dir))))
    actor.init_model()
    critic.init_model()
    return _train_step(actor, critic, rollout_batch(rows=8))


@pytest.fixture(scope="module")
def ray_groups(ray_cluster, tiny_model_dir):
    pool = RayResourcePool(process_on_nodes=[2], max_colocate_count=2)
    groups = [RayWorkerGroup(pool, RayClassWithInitArgs(
                  ActorRolloutRefWorker, actor_config(str(tiny_model_dir)), "actor_rollout_ref")),
              RayWorkerGroup(pool, RayClassWithInitArgs(CriticWorker, critic_config(str(tiny_model_dir))))]
    actor, critic = ActorRolloutRefGroup(groups[0]), CriticGroup(groups[1])
    actor.init_model()
    critic.init_model()
    yield actor, critic
    for group in groups:
        group.shutdown()
    pool.remove()


@pytest.mark.slow
def test_two_ray_ranks_match_one_rank_after_an_update(ray_groups, tiny_model_dir):
    expected = run_on_ranks(_single_rank_reference, 1, str(tiny_model_dir))[0]
    got = _train_step(*ray_groups, rollout_batch(rows=8))
    torch.testing.assert_close(got["log_probs"], expected["log_probs"], rtol=0, atol=1e-5)
    torch.testing.assert_close(got["values"], expected["values"], rtol=0, atol=1e-5)
    torch.testing.assert_close(got["ref"], expected["ref"], rtol=0, atol=1e-5)
    # each rank reports the (already all-reduced) metrics and concat gathers them into lists, so the
    # 2-rank lists hold every value twice; reduced as the trainer reduces them, they match one rank
    got_actor, expected_actor = reduce_metrics(got["actor"]), reduce_metrics(expected["actor"])
    for key in ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm"]:
        assert got_actor[key] == pytest.approx(expected_actor[key], rel=1e-4), key
    assert reduce_metrics(got["critic"])["critic/vf_loss"] == pytest.approx(
        reduce_metrics(expected["critic"])["critic/vf_loss"], rel=1e-4)


@pytest.mark.slow  # the module's Ray cluster and two-rank groups cost half a minute to start
def test_rollout_samples_from_the_updated_actor(ray_groups):
    actor, _ = ray_groups
    prompts = rollout_batch(rows=4).select(batch_keys=["input_ids", "attention_mask", "position_ids"])
    prompts.batch["input_ids"] = prompts.batch["input_ids"][:, :10]
    prompts.batch["attention_mask"] = prompts.batch["attention_mask"][:, :10]
    prompts.batch["position_ids"] = prompts.batch["position_ids"][:, :10]
    for _ in range(2):  # before and after an update: the rollout must always use the current weights
        gen = actor.generate_sequences(prompts)
        assert len(gen) == 8  # 4 prompts x n=2
        recomputed = actor.compute_log_prob(gen).batch["old_log_probs"]
        mask = gen.batch["response_mask"].bool()
        assert (recomputed - gen.batch["rollout_log_probs"])[mask].abs().max() < 1e-5
        gen.union(actor.compute_ref_log_prob(gen))
        gen.batch["old_log_probs"] = recomputed
        gen.batch["advantages"] = torch.linspace(-1, 1, len(gen))[:, None] * gen.batch["response_mask"]
        metrics = actor.update_actor(gen).meta_info["metrics"]
        assert metrics["actor/grad_norm"][0] > 0
    after = actor.compute_log_prob(gen).batch["old_log_probs"]
    assert (after - recomputed)[mask].abs().max() > 1e-3  # the update really moved the policy
