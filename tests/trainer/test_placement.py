"""Which pool holds which role, from verl's keys; what cannot run is refused naming the key and the fix."""

import pytest
from ppo_helpers import ppo_config

from hybridrl.trainer.config_checks import ConfigError, resolve_config
from hybridrl.trainer.main_ppo import run_ppo
from hybridrl.trainer.placement import Pool, placement

BASE = ["data.train_files=x.parquet", "actor_rollout_ref.model.path=some/model", "algorithm.adv_estimator=grpo"]
SPLIT = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
RM = ["reward_model.enable=true", "reward_model.model.path=some/rm"]
RM_POOL = [*RM, "reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=3"]


def pools(*overrides: str) -> list[Pool]:
    return placement(resolve_config(ppo_config(*BASE, *overrides)))


def test_colocated_is_one_pool_with_every_role():
    assert pools() == [Pool("global_pool", 1, 2, ("actor_rollout",))]
    assert pools("actor_rollout_ref.actor.use_kl_loss=true", "algorithm.adv_estimator=gae", *RM) == [
        Pool("global_pool", 1, 2, ("actor_rollout_ref", "critic", "rm"))]


def test_split_gives_the_rollout_its_pool_and_the_training_pool_the_rest():
    got = pools(*SPLIT, "rollout.nnodes=2", "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.adv_estimator=gae")
    assert got == [Pool("global_pool", 1, 1, ("actor_ref", "critic")), Pool("rollout_pool", 2, 1, ("rollout",))]
    assert got[1].world_size == 2 and got[1].process_on_nodes == [1, 1]


def test_a_reward_model_pool_of_its_own_in_either_layout():
    assert pools(*RM_POOL) == [Pool("global_pool", 1, 2, ("actor_rollout",)), Pool("reward_pool", 1, 3, ("rm",))]
    assert [p.name for p in pools(*SPLIT, *RM_POOL)] == ["global_pool", "rollout_pool", "reward_pool"]
    # verl's global micro-batch is divided over the pool that runs the passes: 6 rows over its 3 processes
    config = resolve_config(ppo_config(*BASE, *RM_POOL, "reward_model.micro_batch_size=6"))
    assert config.reward_model.micro_batch_size_per_gpu == 2


@pytest.mark.parametrize(("overrides", "message"), [
    (["actor_rollout_ref.hybrid_engine=false"], "rollout.n_gpus_per_node=0: set rollout.n_gpus_per_node"),
    (["rollout.n_gpus_per_node=2"], "actor_rollout_ref.hybrid_engine=true runs the rollout in the training "
                                    "processes: set actor_rollout_ref.hybrid_engine=false"),
    ([*SPLIT, "trainer.backend=local"], "cannot start the pools of their own this run asks for \\(rollout_pool\\): "
                                        "use trainer.backend=ray"),
    (["reward_model.enable_resource_pool=true"], "without reward_model.enable=true"),
    ([*RM, "reward_model.enable_resource_pool=true"], "reward_model.nnodes=0 and reward_model.n_gpus_per_node=0"),
    ([*SPLIT, "rollout.nnodes=0"], "rollout.nnodes=0 is out of range"),
])
def test_a_placement_that_cannot_run_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(ppo_config(*BASE, *overrides))


def test_the_bucket_size_warns_only_where_no_pool_of_its_own_uses_it(caplog):
    bucket = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64"
    resolve_config(ppo_config(*BASE, *SPLIT, bucket))
    assert "update_weights_bucket_megabytes" not in caplog.text
    resolve_config(ppo_config(*BASE, bucket))
    assert "no effect in this run: actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64" \
        in caplog.text


def test_the_dry_run_prints_every_pool_its_processes_and_roles(capsys):
    assert run_ppo(ppo_config(*BASE, *SPLIT, *RM_POOL, "trainer.dry_run=true")) == []
    out = capsys.readouterr().out
    assert "split: the rollout receives the actor weights after every update" in out
    for line in ("global_pool  1 node(s) x 1 process(es) = 1; roles: actor\n",
                 "rollout_pool 1 node(s) x 1 process(es) = 1; roles: rollout",
                 "reward_pool  1 node(s) x 3 process(es) = 3; roles: rm"):
        assert line in out, line


ONE_STEP_OFF = [*SPLIT, "async_training.mode=one_step_off"]
STREAMING = [*SPLIT, "async_training.mode=streaming"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["async_training.mode=one_step_off"], "needs a rollout pool of its own: set actor_rollout_ref.hybrid_engine=false"),
    ([*ONE_STEP_OFF, *RM], "a reward model cannot share the training pool: set reward_model.enable_resource_pool=true"),
    (["async_training.mode=fully_async"], "async_training.mode must be one of \\('sync', 'one_step_off', 'streaming'\\)"),
    # verl's fully_async keys: read by the streaming mode only, refused in the others, each named
    ([*ONE_STEP_OFF, "async_training.staleness_threshold=0.5"], "async_training.staleness_threshold is a streaming "
                                                               "setting, but async_training.mode=one_step_off"),
    ([*ONE_STEP_OFF, "async_training.partial_rollout=true"], "async_training.partial_rollout is a streaming setting"),
    (["rollout.total_rollout_steps=100"], "rollout.total_rollout_steps is verl's fully_async setting, read in "
                                          "streaming only"),
    (["async_training.mode=streaming"], "async_training.mode=streaming generates while the training pool trains, "
                                        "which needs a rollout pool of its own"),
    ([*STREAMING, "algorithm.filter_groups.enable=true"], "set algorithm.filter_groups.enable=false"),
    ([*STREAMING, "algorithm.adv_estimator=remax"], "algorithm.adv_estimator=remax needs a greedy baseline"),
    ([*STREAMING, "async_training.require_batches=3"], "trains async_training.require_batches x actor_rollout_ref."
                                                       "actor.ppo_mini_batch_size = 24 prompts a step, but "
                                                       "data.train_batch_size=16: set data.train_batch_size=0"),
    ([*STREAMING, "async_training.staleness_threshold=-1"], "async_training.staleness_threshold"),
    ([*STREAMING, "async_training.compute_prox_log_prob=true"], "async_training.compute_prox_log_prob=true is not "
                                                                "supported"),
])
def test_an_async_mode_that_cannot_run_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(ppo_config(*BASE, *overrides))


def test_one_step_off_corrects_the_stale_samples_unless_told_otherwise(capsys):
    correction = resolve_config(ppo_config(*BASE, *ONE_STEP_OFF)).algorithm.rollout_correction
    assert (correction.rollout_is, correction.rollout_is_threshold, correction.bypass_mode) == ("token", 2.0, False)
    # the user's own correction stands, and so does a refusal of the default
    own = ["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_is_threshold=5.0"]
    assert resolve_config(ppo_config(*BASE, *ONE_STEP_OFF, *own)).algorithm.rollout_correction.rollout_is == "sequence"
    off = resolve_config(ppo_config(*BASE, *ONE_STEP_OFF, "async_training.correct_off_policy=false"))
    assert off.algorithm.rollout_correction.rollout_is is None
    # the synchronous split layout samples with the current weights: nothing to correct
    assert resolve_config(ppo_config(*BASE, *SPLIT)).algorithm.rollout_correction.rollout_is is None
    assert run_ppo(ppo_config(*BASE, *ONE_STEP_OFF, "trainer.dry_run=true")) == []
    assert "split, one step off: the rollout generates the next batch with the weights of the step before" \
        in capsys.readouterr().out


def test_streaming_takes_verls_fully_async_keys(capsys):
    # verl's fully_async scripts: data.train_batch_size=0, a step of require_batches mini-batches, the run's length in
    # prompts, validation every rollout.test_freq weight syncs
    config = resolve_config(ppo_config(*BASE, *STREAMING, "data.train_batch_size=0", "async_training.require_batches=2",
                                       "async_training.trigger_parameter_sync_step=3", "rollout.total_rollout_steps=48",
                                       "rollout.test_freq=2", "rollout.total_epochs=7",
                                       "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true"))
    mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
    assert config.data.train_batch_size == 2 * mini
    assert config.trainer.total_training_steps == 48 // (2 * mini)
    assert (config.trainer.test_freq, config.trainer.total_epochs) == (6, 7)
    assert config.algorithm.rollout_correction.rollout_is == "token"  # decoupled correction by default
    bypass = resolve_config(ppo_config(*BASE, *STREAMING, "async_training.use_rollout_log_probs=true"))
    assert bypass.algorithm.rollout_correction.bypass_mode
    # verl's fully_async scripts generate with vLLM; streaming decodes with the HF engine's continuous batch
    assert resolve_config(ppo_config(*BASE, *STREAMING, "actor_rollout_ref.rollout.name=vllm")) \
        .actor_rollout_ref.rollout.name == "hf"
    # a synchronous config switched to streaming trains as many prompts a step
    switched = resolve_config(ppo_config(*BASE, *STREAMING))
    assert switched.data.train_batch_size == 16 and switched.async_training.require_batches == 16 // mini
    assert run_ppo(ppo_config(*BASE, *STREAMING, "trainer.dry_run=true")) == []
    assert "split, streaming: the rollout decodes without pause" in capsys.readouterr().out
