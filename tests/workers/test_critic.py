"""PPOCritic: values at the position before each response token, computed with each shared prompt once
(`critic.model.share_prompt_forward`) or padded, and the same update either way."""

from __future__ import annotations

import pytest
import torch
from batches import rollout_batch
from spmd import run_on_ranks
from test_actor import GradRecordingEngine

from hybridrl.models.loading import load_value_model
from hybridrl.workers.config import CriticConfig, FSDPConfig, OptimConfig
from hybridrl.workers.critic import SHARE_KEY, PPOCritic
from hybridrl.workers.fsdp_engine import FSDPEngine
from hybridrl.workers.response_pass import PromptSharing
from hybridrl.workers.update_loop import BatchingPlan


def reference_values(model: torch.nn.Module, data) -> torch.Tensor:
    """The definition: one unsharded forward over the full padded rows; V(s_t) for response token t is the
    head's output at the column before it, zero after the response's end."""
    with torch.no_grad():
        out = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                    position_ids=data.batch["position_ids"]).logits[..., 0]
    response_len = data.batch["responses"].shape[1]
    return out[:, -response_len - 1:-1] * data.batch["response_mask"]


def _values_and_update(rank, world_size, model_dir, plan_kwargs, checkpointing=False):
    out = {}
    data = rollout_batch(rows=16, group_size=4)
    returns = torch.randn(data.batch["responses"].shape, generator=torch.Generator().manual_seed(1))
    data.batch["returns"] = returns * data.batch["response_mask"]
    expected = reference_values(load_value_model(model_dir), data).chunk(world_size)[rank]
    mine = data.chunk(world_size)[rank]
    for share in (False, True):
        torch.manual_seed(0)
        model = load_value_model(model_dir, gradient_checkpointing=checkpointing)
        engine = GradRecordingEngine(model, FSDPConfig(), OptimConfig(lr=1e-4))
        critic = PPOCritic(CriticConfig(), engine, share_prompts=share)
        assert critic.share_prompts == share
        shapes: list[tuple[int, ...]] = []

        def record(module, args, kwargs, shapes=shapes):
            shapes.append(tuple(kwargs["input_ids"].shape))

        hook = model.register_forward_pre_hook(record, with_kwargs=True)
        values = critic.compute_values(mine, 8, None)
        hook.remove()
        mine.batch["values"] = values
        metrics = critic.update_critic(mine, BatchingPlan(mini_batch_rows=len(mine), **plan_kwargs))
        out[share] = (values, shapes, engine.recorded, metrics)
    return expected, out


@pytest.mark.parametrize("world_size,plan_kwargs,checkpointing", [
    (1, {"micro_batch_rows": 6}, False),  # a group of 4 split over two micro-batches, others whole
    (2, {"max_token_len": 80, "shuffle": True, "seed": 1}, False),
    (1, {"micro_batch_rows": 6}, True),  # backward recomputes each layer: the packed attention is held
])
def test_shared_prompt_values_and_gradients_are_the_padded_passes(tiny_model_dir, world_size, plan_kwargs,
                                                                   checkpointing):
    for expected, out in run_on_ranks(_values_and_update, world_size, str(tiny_model_dir), plan_kwargs,
                                      checkpointing):
        (values, padded_shapes, grads, metrics), (shared_values, shared_shapes, shared_grads, shared_metrics) = \
            out[False], out[True]
        torch.testing.assert_close(values, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(shared_values, expected, rtol=0, atol=1e-5)
        # padded: (rows, width) per micro-batch; shared: one packed row per micro-batch, fewer tokens in all
        assert all(rows > 1 for rows, _ in padded_shapes)
        assert all(rows == 1 for rows, _ in shared_shapes)
        assert sum(w for _, w in shared_shapes) < sum(r * w for r, w in padded_shapes)
        assert grads and grads.keys() == shared_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        assert shared_metrics["critic/vf_loss"][0] == pytest.approx(metrics["critic/vf_loss"][0], rel=1e-5)


WINDOWED = {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}


def _cannot_share(rank, world_size, model_dir):
    model = load_value_model(model_dir, override_config=WINDOWED)
    critic = PPOCritic(CriticConfig(), FSDPEngine(model, FSDPConfig()), share_prompts=True)
    data = rollout_batch(rows=8, group_size=4)
    return critic.share_prompts, critic.compute_values(data, 8, None), reference_values(model, data)


def test_a_model_that_cannot_share_prompts_runs_padded_and_warns_naming_the_critic_key(tiny_model_dir, caplog):
    share, values, expected = run_on_ranks(_cannot_share, 1, str(tiny_model_dir))[0]
    assert not share
    torch.testing.assert_close(values, expected, rtol=0, atol=1e-5)
    model = load_value_model(str(tiny_model_dir), override_config=WINDOWED)
    with caplog.at_level("WARNING"):
        assert not PromptSharing(model, True, SHARE_KEY).enabled
    assert "critic.model.share_prompt_forward=true" in caplog.text


def _worker_values(rank, world_size, model_dir):
    from hybridrl.controller import ClassWithInitArgs, LocalWorkerGroup
    from hybridrl.workers.fsdp_workers import CriticWorker

    out = {}
    data = rollout_batch(rows=8, group_size=4)
    for share in (True, False):
        group = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, {
            "model": {"path": model_dir, "share_prompt_forward": share}, "rollout_n": 4, "ppo_mini_batch_size": 2,
            "ppo_micro_batch_size_per_gpu": 8, "forward_micro_batch_size_per_gpu": 8}))
        group.call("init_model")
        out[share] = (group.worker.critic.share_prompts, group.call("compute_values", data).batch["values"])
        group.shutdown()
    return out, reference_values(load_value_model(model_dir), data)


def test_the_critic_worker_takes_critic_model_share_prompt_forward(tiny_model_dir):
    out, expected = run_on_ranks(_worker_values, 1, str(tiny_model_dir))[0]
    assert out[True][0] is True and out[False][0] is False
    for _, values in out.values():
        torch.testing.assert_close(values, expected, rtol=0, atol=1e-5)
