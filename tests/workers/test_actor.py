"""The actor on real gloo ranks: log-probs by definition, micro-batching and accumulation invariance,
rollout IS weights in the gradient."""

import pytest
import torch
from batches import reference_log_probs, rollout_batch
from spmd import run_on_ranks

from hybridrl.models.loading import load_causal_lm
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.config import ActorConfig, FSDPConfig, MixedPrecisionConfig, OptimConfig
from hybridrl.workers.fsdp_engine import FSDPEngine
from hybridrl.workers.micro_batch import make_micro_batches
from hybridrl.workers.response_pass import prompt_group_ids
from hybridrl.workers.update_loop import BatchingPlan

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


class GradRecordingEngine(FSDPEngine):
    """The real engine; it also keeps a copy of the accumulated full gradient before each step."""

    def clip_and_step(self):
        self.recorded = {n: p.grad.full_tensor().clone() for n, p in self.module.named_parameters()
                         if p.grad is not None}
        return super().clip_and_step()


def _log_probs(rank, world_size, model_dir, settings):
    torch.manual_seed(0)
    model = load_causal_lm(model_dir)
    data = rollout_batch(rows=8)
    expected = reference_log_probs(model, data, temperature=0.7)
    actor = PPOActor(ActorConfig(), FSDPEngine(model, FSDPConfig()))
    mine = data.chunk(world_size)[rank]
    results = {}
    for name, (rows, tokens) in settings.items():
        log_probs, entropy = actor.compute_log_prob(mine, rows, tokens, calculate_entropy=True)
        results[name] = (log_probs, entropy)
    return expected.chunk(world_size)[rank], results


@pytest.mark.parametrize("world_size", [1, 2])
def test_log_probs_match_the_definition_for_any_micro_batching(tiny_model_dir, world_size):
    settings = {"one pass": (None, 2**31), "micro 1": (1, None), "micro 3": (3, None), "budget 60": (None, 60)}
    for expected, results in run_on_ranks(_log_probs, world_size, str(tiny_model_dir), settings):
        for name, (log_probs, entropy) in results.items():
            torch.testing.assert_close(log_probs, expected, rtol=0, atol=1e-5, msg=name)
            assert entropy.shape == expected.shape and (entropy >= 0).all()


def _grads(rank, world_size, model_dir, micro_rows, modes):
    """Accumulated gradients and metrics of one update, per aggregation mode (one process, many engines)."""
    out = {}
    for mode in modes:
        torch.manual_seed(0)
        engine = GradRecordingEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-4))
        config = ActorConfig(loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01)
        data = rollout_batch(rows=8).chunk(world_size)[rank]
        metrics = PPOActor(config, engine).update_policy(
            data, BatchingPlan(mini_batch_rows=len(data), micro_batch_rows=micro_rows))
        out[mode] = (engine.recorded, metrics)
    return out


def test_micro_batches_and_ranks_give_the_big_batch_gradient_in_every_agg_mode(tiny_model_dir):
    whole = run_on_ranks(_grads, 1, str(tiny_model_dir), 8, AGG_MODES)[0]
    micro = run_on_ranks(_grads, 1, str(tiny_model_dir), 3, AGG_MODES)[0]
    for mode in AGG_MODES:
        (whole_grads, whole_metrics), (micro_grads, micro_metrics) = whole[mode], micro[mode]
        for name, grad in whole_grads.items():
            torch.testing.assert_close(micro_grads[name], grad, rtol=1e-4, atol=1e-6, msg=f"{mode} {name}")
        assert micro_metrics["actor/pg_loss"][0] == pytest.approx(whole_metrics["actor/pg_loss"][0], rel=1e-5)
    # the same global batch split over 2 ranks, micro-batched on each
    two_modes = ["token-mean", "seq-mean-token-mean"]
    ranks = run_on_ranks(_grads, 2, str(tiny_model_dir), 2, two_modes)
    for mode in two_modes:
        whole_grads, whole_metrics = whole[mode]
        for name, grad in whole_grads.items():
            torch.testing.assert_close(ranks[0][mode][0][name], grad, rtol=1e-4, atol=1e-6, msg=f"{mode} {name}")
        assert ranks[0][mode][1]["actor/pg_loss"][0] == pytest.approx(whole_metrics["actor/pg_loss"][0], rel=1e-5)
        assert ranks[0][mode][1]["actor/grad_norm"] == ranks[1][mode][1]["actor/grad_norm"]


def _fused_and_two_pass(rank, world_size, model_dir, plan_kwargs):
    """One update both ways from the same start: old log-probs from a separate pass, and from the update."""
    out = {}
    for fused in (False, True):
        torch.manual_seed(0)
        engine = GradRecordingEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-4))
        actor = PPOActor(ActorConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01), engine)
        data = rollout_batch(rows=8).chunk(world_size)[rank]
        data.batch.pop("old_log_probs")
        plan = BatchingPlan(mini_batch_rows=len(data), **plan_kwargs)
        if fused:
            metrics, old_log_probs = actor.update_policy_fused(data, plan)
            assert "row_index" not in set(data.batch.keys())  # the caller's batch is left as it was
        else:
            old_log_probs, _ = actor.compute_log_prob(data, None, 2**31)
            data.batch["old_log_probs"] = old_log_probs
            metrics = actor.update_policy(data, plan)
        out[fused] = (engine.recorded, metrics, old_log_probs)
    return out


@pytest.mark.parametrize("world_size,plan_kwargs", [
    (1, {"micro_batch_rows": 3}),
    (2, {"max_token_len": 60, "shuffle": True, "seed": 3}),  # token budget: rows reordered by length
])
def test_old_log_probs_from_the_update_give_the_two_pass_update(tiny_model_dir, world_size, plan_kwargs):
    for rank in run_on_ranks(_fused_and_two_pass, world_size, str(tiny_model_dir), plan_kwargs):
        (two_grads, two_metrics, two_old), (fused_grads, fused_metrics, fused_old) = rank[False], rank[True]
        # the update's forward pass sees the weights the separate pass saw: same log-probs, in row order
        torch.testing.assert_close(fused_old, two_old, rtol=0, atol=1e-5)
        for name, grad in two_grads.items():
            torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        # ratio 1 exactly: the clip never acts
        assert fused_metrics["actor/pg_clipfrac"] == [0.0]
        assert fused_metrics["actor/entropy"][0] == pytest.approx(two_metrics["actor/entropy"][0], rel=1e-5)


def _updates_under_a_meta_default(rank, world_size, model_dir):
    """Log-probs and updates, first plainly and then under torch.device("meta"), from the same start."""
    config = ActorConfig(use_kl_loss=True, entropy_coeff=0.01)
    data = rollout_batch(rows=8)
    shuffled = BatchingPlan(mini_batch_rows=4, micro_batch_rows=3, epochs=2, shuffle=True, seed=1)
    results = []
    for default_device in ("cpu", "meta"):
        torch.manual_seed(0)
        actor = PPOActor(config, FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-4)))
        actor.update_policy(data, shuffled)  # the optimizer makes its state here, outside the meta default
        with torch.device(default_device):
            log_probs, entropy = actor.compute_log_prob(data, 3, None, calculate_entropy=True)
            fused_metrics, old_log_probs = actor.update_policy_fused(
                data, BatchingPlan(mini_batch_rows=8, max_token_len=60))
            metrics = actor.update_policy(data, shuffled)
        results.append((log_probs, entropy, old_log_probs, fused_metrics, metrics))
    return results


def test_log_probs_and_updates_make_their_tensors_on_the_inputs_device(tiny_model_dir):
    # No GPU here: under torch.device("meta") a tensor made without naming a device (an index, a mask, a
    # buffer to scatter into) lands on meta and fails the first time it meets an input or is read, as a
    # CPU tensor beside CUDA ones does. The results must be those of the same run without it.
    [(plain, on_meta_default)] = run_on_ranks(_updates_under_a_meta_default, 1, str(tiny_model_dir))
    for expected, got in zip(plain[:3], on_meta_default[:3], strict=True):
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert on_meta_default[3:] == plain[3:]  # the metrics of both updates


def _fused_refuses(rank, world_size, model_dir):
    actor = PPOActor(ActorConfig(), FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig()))
    data = rollout_batch(rows=8)
    for plan in (BatchingPlan(mini_batch_rows=4), BatchingPlan(mini_batch_rows=8, epochs=2)):
        with pytest.raises(ValueError, match="one epoch over one mini-batch"):
            actor.update_policy_fused(data, plan)


def test_old_log_probs_from_the_update_need_one_epoch_over_one_mini_batch(tiny_model_dir):
    run_on_ranks(_fused_refuses, 1, str(tiny_model_dir))


def _pg_loss_by_hand(model, data, weights, temperature=0.7):
    """ActorConfig's default loss written out: PPO clip 0.2 with dual clip 3, times the IS weights,
    summed over valid tokens and divided by their count (token-mean)."""
    logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                   position_ids=data.batch["position_ids"]).logits / temperature
    response_len = data.batch["responses"].shape[1]
    log_probs = torch.log_softmax(logits[:, -response_len - 1:-1].float(), dim=-1) \
        .gather(-1, data.batch["responses"][..., None])[..., 0]  # (rows, response_len)
    mask = data.batch["response_mask"].float()
    adv, ratio = data.batch["advantages"], torch.exp(log_probs - data.batch["old_log_probs"])
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)
    return (per_token * weights * mask).sum() / mask.sum()


def _is_weighted_grads(rank, world_size, model_dir, micro_rows):
    """Gradients of one update with rollout_is_weights, of the hand-written loss, and of two runs that a
    weight-0 row and a zero-advantage row must make equal."""
    data = rollout_batch(rows=8)
    mask = data.batch["response_mask"]
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(1)) * 2 * mask  # (rows, response_len)
    weights[0] = 0.0  # row 0 contributes nothing
    grads = {}
    for name, column, advantages in (("weighted", weights, None), ("row 0 weight 0", (weights > 0).float(), None),
                                     ("row 0 advantage 0", None, 0.0)):
        torch.manual_seed(0)
        engine = GradRecordingEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-4))
        run = data.select(deepcopy=True)
        if column is not None:
            run.batch["rollout_is_weights"] = column
        if advantages is not None:
            run.batch["advantages"][0] = advantages
        PPOActor(ActorConfig(), engine).update_policy(run, BatchingPlan(mini_batch_rows=8, micro_batch_rows=micro_rows))
        grads[name] = engine.recorded
    model = load_causal_lm(model_dir)
    _pg_loss_by_hand(model, data, weights).backward()
    grads["by hand"] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return grads


@pytest.mark.parametrize("micro_rows", [8, 3])
def test_rollout_is_weights_scale_each_tokens_gradient(tiny_model_dir, micro_rows):
    grads = run_on_ranks(_is_weighted_grads, 1, str(tiny_model_dir), micro_rows)[0]
    assert grads["weighted"].keys() == grads["by hand"].keys()
    for name, grad in grads["by hand"].items():
        torch.testing.assert_close(grads["weighted"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # a weight of 0 removes a token's loss exactly as a zero advantage does (the token count stays)
    for name, grad in grads["row 0 advantage 0"].items():
        torch.testing.assert_close(grads["row 0 weight 0"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert any(not torch.allclose(grads["weighted"][n], g) for n, g in grads["row 0 weight 0"].items())


def _bf16_update(rank, world_size, model_dir):
    torch.manual_seed(0)
    fsdp = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16"))
    engine = FSDPEngine(load_causal_lm(model_dir), fsdp, OptimConfig(lr=1e-3))
    actor = PPOActor(ActorConfig(), engine)
    data = rollout_batch(rows=8)
    data.batch.pop("old_log_probs")
    expected = reference_log_probs(load_causal_lm(model_dir), data, temperature=0.7)  # fp32 model
    before = {n: p.full_tensor().clone() for n, p in engine.module.named_parameters()}
    metrics, old_log_probs = actor.update_policy_fused(data, BatchingPlan(mini_batch_rows=8, micro_batch_rows=4))
    after = dict(engine.module.named_parameters())
    return expected, old_log_probs, metrics, before, {n: p.full_tensor() for n, p in after.items()}


def test_a_bf16_update_keeps_fp32_master_weights_and_fp32_log_probs(tiny_model_dir):
    expected, old_log_probs, metrics, before, after = run_on_ranks(_bf16_update, 1, str(tiny_model_dir))[0]
    assert old_log_probs.dtype == torch.float32
    # bf16 matmuls round at ~3 significant digits: close to the fp32 log-probs, not equal to them
    difference = (old_log_probs - expected).abs().max()
    assert 0 < difference < 0.1, difference
    assert metrics["actor/grad_norm"][0] > 0
    for name, weight in after.items():
        assert weight.dtype == torch.float32, name  # the sharded master copy the optimizer steps
    assert any(not torch.equal(before[n], after[n]) for n in after)  # the update reached the fp32 weights


def _shared_and_padded(rank, world_size, model_dir, plan_kwargs, checkpointing=False):
    """Log-probs and one update's gradients with prompts computed once per group, and padded."""
    out = {}
    for share in (False, True):
        torch.manual_seed(0)
        model = load_causal_lm(model_dir, gradient_checkpointing=checkpointing)
        engine = GradRecordingEngine(model, FSDPConfig(), OptimConfig(lr=1e-4))
        actor = PPOActor(ActorConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01), engine,
                         share_prompts=share)
        assert actor.share_prompts == share
        data = rollout_batch(rows=16, group_size=4).chunk(world_size)[rank]
        log_probs, entropy = actor.compute_log_prob(data, 3, None, calculate_entropy=True)
        metrics = actor.update_policy(data, BatchingPlan(mini_batch_rows=len(data), **plan_kwargs))
        out[share] = (log_probs, entropy, engine.recorded, metrics)
    return out


@pytest.mark.parametrize("world_size,plan_kwargs,checkpointing", [
    (1, {"micro_batch_rows": 6}, False),  # a group of 4 split over two micro-batches, others whole
    (2, {"max_token_len": 80, "shuffle": True, "seed": 1}, False),
    (1, {"micro_batch_rows": 6}, True),  # backward recomputes each layer: the packed attention is held
])
def test_prompts_computed_once_per_group_give_the_padded_log_probs_and_gradients(tiny_model_dir, world_size,
                                                                                 plan_kwargs, checkpointing):
    for rank in run_on_ranks(_shared_and_padded, world_size, str(tiny_model_dir), plan_kwargs, checkpointing):
        (log_probs, entropy, grads, metrics), (shared_lp, shared_entropy, shared_grads, shared_metrics) = \
            rank[False], rank[True]
        torch.testing.assert_close(shared_lp, log_probs, rtol=0, atol=1e-5)
        torch.testing.assert_close(shared_entropy, entropy, rtol=0, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        assert shared_metrics["actor/pg_loss"][0] == pytest.approx(metrics["actor/pg_loss"][0], rel=1e-5)


def _packed_widths(rank, world_size, model_dir):
    data = rollout_batch(rows=16, group_size=4)
    model = load_causal_lm(model_dir)
    actor = PPOActor(ActorConfig(), FSDPEngine(model, FSDPConfig()), share_prompts=True)
    shapes = []
    model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                    with_kwargs=True)
    actor.compute_log_prob(data, 8, None)
    prompts = data.batch["input_ids"][:, :10]
    prompts_per_micro_batch = [len({tuple(prompts[i].tolist()) for i in micro.indices})
                               for micro in make_micro_batches(data, 8, None, prompt_group_ids(data))]
    return shapes, prompts_per_micro_batch


def test_micro_batches_keep_a_groups_rows_together_and_its_prompt_is_computed_once(tiny_model_dir):
    shapes, prompts_per_micro_batch = run_on_ranks(_packed_widths, 1, str(tiny_model_dir))[0]
    # 4 groups of 4 rows in micro-batches of 8: each holds two whole groups, one packed row each
    assert prompts_per_micro_batch == [2, 2]
    assert len(shapes) == 2 and all(rows == 1 for rows, _ in shapes)


def _sum_pi_squared(rank, world_size, model_dir):
    torch.manual_seed(0)
    model = load_causal_lm(model_dir)
    data = rollout_batch(rows=6, group_size=2)  # shared prompts: the packed pass
    with torch.no_grad():  # the definition: full padded rows, softmax at temperature 0.7, squared, summed
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits / 0.7
    response_len = data.batch["responses"].shape[1]
    probs = torch.softmax(logits[:, -response_len - 1:-1].float(), dim=-1)
    expected = probs.square().sum(-1) * data.batch["response_mask"]
    actor = PPOActor(ActorConfig(), FSDPEngine(model, FSDPConfig()), share_prompts=True)
    outputs = actor.compute_response_outputs(data, 4, None, calculate_sum_pi_squared=True)
    return expected, outputs


def test_sum_pi_squared_matches_its_definition(tiny_model_dir):
    [(expected, outputs)] = run_on_ranks(_sum_pi_squared, 1, str(tiny_model_dir))
    assert set(outputs) == {"log_probs", "sum_pi_squared"}
    torch.testing.assert_close(outputs["sum_pi_squared"], expected, rtol=0, atol=1e-5)
