"""Ulysses sequence parallelism on real gloo ranks: each rank of a group runs 1/size of every sequence, and
the log-probs, values, gradients and metrics are those of whole sequences on one rank."""

from __future__ import annotations

import pytest
import torch
from batches import reference_log_probs, rollout_batch
from spmd import run_on_ranks
from test_actor import GradRecordingEngine
from test_critic import reference_values

from hybridrl.models.loading import load_causal_lm, load_value_model
from hybridrl.utils.typed_config import ConfigError
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.config import (
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    FSDPConfig,
    OptimConfig,
    actor_sequence_parallel,
)
from hybridrl.workers.critic import PPOCritic
from hybridrl.workers.sequence_parallel import ULYSSES, SequenceParallel, model_problem
from hybridrl.workers.update_loop import BatchingPlan, check_sequence_parallel

ROWS = 8


def _actor_update(rank, world_size, model_dir, sp, attention, checkpointing, plan_kwargs):
    """Log-probs, then one PPO update (KL and entropy terms on), on this rank's chunk of one batch."""
    torch.manual_seed(0)
    model = load_causal_lm(model_dir, attn_implementation=attention, gradient_checkpointing=checkpointing)
    data = rollout_batch(rows=ROWS, prompt_len=11, response_len=13)  # widths that do not divide by the group
    expected = reference_log_probs(load_causal_lm(model_dir), data, temperature=0.7).chunk(world_size)[rank]
    engine = GradRecordingEngine(model, FSDPConfig(), OptimConfig(lr=1e-4), sequence_parallel_size=sp)
    actor = PPOActor(ActorConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01), engine,
                     share_prompts=True)  # asked for, but no prompt is shared with sequence parallelism
    mine = data.chunk(world_size)[rank]
    log_probs, entropy = actor.compute_log_prob(mine, 3, None, calculate_entropy=True)
    metrics = actor.update_policy(mine, BatchingPlan(mini_batch_rows=len(mine), **plan_kwargs))
    assert model.config._attn_implementation == attention  # the model's own attention again after the passes
    return expected, log_probs, entropy, engine.recorded, metrics, actor.share_prompts


def _check_against_one_rank(world_size, sp, model_dir, attention="sdpa", checkpointing=False, plan_kwargs=None):
    plan_kwargs = plan_kwargs or {"micro_batch_rows": 3}
    _, one_lp, one_entropy, one_grads, one_metrics, _ = run_on_ranks(
        _actor_update, 1, model_dir, 1, attention, False, {"micro_batch_rows": 3})[0]
    ranks = run_on_ranks(_actor_update, world_size, model_dir, sp, attention, checkpointing, plan_kwargs)
    rows = ROWS // world_size
    for rank, (expected, log_probs, entropy, grads, metrics, shared) in enumerate(ranks):
        assert not shared
        torch.testing.assert_close(log_probs, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(entropy, one_entropy[rank * rows:(rank + 1) * rows], rtol=0, atol=1e-5)
        for name, grad in one_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        for name in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
            assert metrics[name][0] == pytest.approx(one_metrics[name][0], rel=1e-5), name
    del one_lp


def test_a_group_of_two_ranks_gives_one_ranks_log_probs_gradients_and_metrics(tiny_model_dir):
    _check_against_one_rank(2, 2, str(tiny_model_dir))


def test_two_groups_of_two_ranks_and_gradient_checkpointing_give_the_same(tiny_model_dir):
    # four ranks: two data-parallel groups, each splitting its rows' sequences; backward reruns the layers
    _check_against_one_rank(4, 2, str(tiny_model_dir), checkpointing=True,
                            plan_kwargs={"max_token_len": 40, "shuffle": True, "seed": 2})


@pytest.mark.slow
def test_more_ranks_than_key_value_heads_and_eager_attention_give_the_same(tiny_model_dir):
    # 4 query heads, 2 key/value heads over 4 ranks: each rank attends with a copy of its query head's
    _check_against_one_rank(4, 4, str(tiny_model_dir), attention="eager")


def _critic(rank, world_size, model_dir, sp):
    torch.manual_seed(0)
    data = rollout_batch(rows=ROWS, prompt_len=11, response_len=13, group_size=2)
    data.batch["returns"] = torch.randn(data.batch["responses"].shape,
                                        generator=torch.Generator().manual_seed(1)) * data.batch["response_mask"]
    expected = reference_values(load_value_model(model_dir), data).chunk(world_size)[rank]
    engine = GradRecordingEngine(load_value_model(model_dir), FSDPConfig(), OptimConfig(lr=1e-4),
                                 sequence_parallel_size=sp)
    critic = PPOCritic(CriticConfig(), engine)
    mine = data.chunk(world_size)[rank]
    values = critic.compute_values(mine, 2, None)
    mine.batch["values"] = values
    metrics = critic.update_critic(mine, BatchingPlan(mini_batch_rows=len(mine), micro_batch_rows=3))
    return expected, values, engine.recorded, metrics


def test_the_critics_values_and_gradients_split_over_two_ranks_are_one_ranks(tiny_model_dir):
    ((_, _, one_grads, one_metrics),) = run_on_ranks(_critic, 1, str(tiny_model_dir), 1)
    for expected, values, grads, metrics in run_on_ranks(_critic, 2, str(tiny_model_dir), 2):
        torch.testing.assert_close(values, expected, rtol=0, atol=1e-5)
        for name, grad in one_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        assert metrics["critic/vf_loss"][0] == pytest.approx(one_metrics["critic/vf_loss"][0], rel=1e-5)


def _fused(rank, world_size, model_dir):
    torch.manual_seed(0)
    engine = GradRecordingEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-4),
                                 sequence_parallel_size=world_size)
    actor = PPOActor(ActorConfig(), engine)
    mine = rollout_batch(rows=ROWS).chunk(world_size)[rank]
    separate, _ = actor.compute_log_prob(mine, None, 2**31)
    _, fused = actor.update_policy_fused(mine, BatchingPlan(mini_batch_rows=len(mine), micro_batch_rows=2))
    return separate, fused


def test_old_log_probs_from_the_update_are_each_ranks_own_rows(tiny_model_dir):
    for separate, fused in run_on_ranks(_fused, 2, str(tiny_model_dir)):
        assert fused.shape == (ROWS // 2, 12)
        torch.testing.assert_close(fused, separate, rtol=0, atol=1e-5)


def _attention_layers_see_whole_sequences(rank, world_size, model_dir):
    """Each rank's query columns and the columns its attention reads, through a hook on the attention."""
    from hybridrl.workers import sequence_parallel as module

    seen = []
    real = module.ulysses_attention

    def spy(attn, query, key, value, *args, **kwargs):
        seen.append((query.shape[2], kwargs[module.LAYOUT_KWARG].real.shape[1]))
        return real(attn, query, key, value, *args, **kwargs)

    module.AttentionInterface.register(ULYSSES, spy)
    try:
        engine = GradRecordingEngine(load_causal_lm(model_dir), FSDPConfig(), sequence_parallel_size=world_size)
        actor = PPOActor(ActorConfig(), engine)
        actor.compute_log_prob(rollout_batch(rows=4).chunk(world_size)[rank], None, 2**31)
    finally:
        module.AttentionInterface.register(ULYSSES, real)
    return seen


def test_each_rank_runs_its_share_of_the_columns_and_attends_over_all_of_them(tiny_model_dir):
    for seen in run_on_ranks(_attention_layers_see_whole_sequences, 2, str(tiny_model_dir)):
        assert len(seen) == 4  # one per decoder layer
        for local, whole in seen:
            assert local * 2 == whole  # (trimmed width padded to a multiple of 2) / 2 each


def test_model_problems_name_what_cannot_split(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)  # 4 attention heads, 2 key/value heads
    assert model_problem(model, 2) is None and model_problem(model, 4) is None
    assert "4 attention heads do not divide among 3 ranks" in model_problem(model, 3)
    model.set_attn_implementation("flex_attention")
    assert "flex_attention" in model_problem(model, 2)
    assert SequenceParallel.build(1, "key") == SequenceParallel()


def test_sizes_come_from_verl_keys_and_must_divide_the_ranks():
    config = ActorRolloutRefConfig()
    config.actor.ulysses_sequence_parallel_size = 2
    assert actor_sequence_parallel(config) == (2, 2)  # the reference follows the actor, as in verl
    config.ref.ulysses_sequence_parallel_size = 1
    assert actor_sequence_parallel(config) == (2, 1)
    config.actor.ulysses_sequence_parallel_size = 1
    config.actor.fsdp_config.ulysses_sequence_parallel_size = 4  # verl's engine-level name
    assert actor_sequence_parallel(config)[0] == 4
    config.actor.ulysses_sequence_parallel_size = 2
    with pytest.raises(ConfigError, match="actor.fsdp_config.ulysses_sequence_parallel_size=4 disagree"):
        actor_sequence_parallel(config)
    check_sequence_parallel(2, 8, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size=3 must divide the role's 8 ranks"):
        check_sequence_parallel(3, 8, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
