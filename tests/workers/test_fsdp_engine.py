"""FSDP2 engine on real gloo ranks: sharding, the 1-rank vs 2-rank equivalence, clipping, schedules."""

import math

import pytest
import torch
from spmd import run_on_ranks

from hybridrl.models.loading import load_causal_lm
from hybridrl.workers.checkpoint import CheckpointManager
from hybridrl.workers.config import FSDPConfig, OptimConfig
from hybridrl.workers.fsdp_engine import FSDPEngine, lr_lambda


def _one_step(rank, world_size, model_dir, grad_clip, offload, fsdp_size=-1, save_to=None):
    torch.manual_seed(0)
    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(param_offload=offload, optimizer_offload=offload,
                                                              fsdp_size=fsdp_size),
                        OptimConfig(lr=1e-3), grad_clip=grad_clip)
    local = sum(p.to_local().numel() for p in engine.module.parameters())
    total = sum(p.numel() for p in engine.module.parameters())
    ids = torch.randint(0, 300, (4, 12), generator=torch.Generator().manual_seed(1))
    mine = ids.chunk(world_size)[rank]  # the same global batch, split by rank
    logits = engine.module(input_ids=mine).logits.float()
    # mean over the global batch; FSDP averages gradients over ranks, so scale back by world size
    loss = logits.logsumexp(-1).sum() / ids.numel() * world_size
    loss.backward()
    engine.offload_params()
    engine.offload_optimizer()
    engine.load_params()
    engine.load_optimizer()
    metrics = engine.clip_and_step()
    state = {k: v.clone() for k, v in engine.full_model_state_dict().items()}
    if save_to:
        CheckpointManager(engine, None, {"save_contents": ["model", "optimizer"]}).save_checkpoint(save_to, 1)
    return {"metrics": metrics, "local": local, "total": total, "state": state, "mesh": engine.mesh.shape}


def _loaded(rank, world_size, model_dir, path):
    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-3))
    CheckpointManager(engine, None, {"save_contents": ["model", "optimizer"]}).load_checkpoint(path)
    return {k: v.clone() for k, v in engine.full_model_state_dict().items()}


def test_hybrid_sharding_matches_one_rank_and_its_checkpoint_loads_fully_sharded(tiny_model_dir, tmp_path):
    one = run_on_ranks(_one_step, 1, str(tiny_model_dir), 1.0, False)[0]
    # 4 ranks, fsdp_size=2: two groups of 2 ranks, each holding one sharded copy
    hybrid = run_on_ranks(_one_step, 4, str(tiny_model_dir), 1.0, False, 2, str(tmp_path / "actor"))
    assert [r["mesh"] for r in hybrid] == [(2, 2)] * 4
    assert hybrid[0]["local"] + hybrid[1]["local"] == hybrid[0]["total"]  # half of every parameter per rank
    assert hybrid[0]["local"] == hybrid[2]["local"]  # the other group holds the same halves
    assert math.isclose(one["metrics"]["grad_norm"], hybrid[0]["metrics"]["grad_norm"], rel_tol=1e-5)
    for key, value in one["state"].items():
        torch.testing.assert_close(hybrid[0]["state"][key], value, rtol=0, atol=1e-5)
    loaded = run_on_ranks(_loaded, 2, str(tiny_model_dir), str(tmp_path / "actor"))[0]
    for key, value in hybrid[0]["state"].items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("offload", [False, True])
def test_two_ranks_match_one_rank_after_a_step(tiny_model_dir, offload):
    one = run_on_ranks(_one_step, 1, str(tiny_model_dir), 1.0, offload)[0]
    two = run_on_ranks(_one_step, 2, str(tiny_model_dir), 1.0, offload)
    # each rank holds about half of every parameter
    assert abs(two[0]["local"] - two[0]["total"] / 2) / two[0]["total"] < 0.05
    assert two[0]["local"] + two[1]["local"] == two[0]["total"]
    assert math.isclose(one["metrics"]["grad_norm"], two[0]["metrics"]["grad_norm"], rel_tol=1e-5)
    assert two[0]["metrics"]["grad_norm"] == two[1]["metrics"]["grad_norm"]  # the global norm, on both
    assert two[1]["state"] == {}  # the full state dict is gathered on rank 0 only
    for key, value in one["state"].items():
        torch.testing.assert_close(two[0]["state"][key], value, rtol=0, atol=1e-5)


def _clip_step(rank, world_size, model_dir):
    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-3), grad_clip=1e-3)
    logits = engine.module(input_ids=torch.arange(10).view(1, 10)).logits
    logits.float().pow(2).mean().backward()
    before = torch.sqrt(sum(p.grad.full_tensor().pow(2).sum() for p in engine.module.parameters()))
    metrics = engine.clip_and_step()
    return before.item(), metrics


def test_grad_norm_is_reported_before_clipping(tiny_model_dir):
    before, metrics = run_on_ranks(_clip_step, 1, str(tiny_model_dir))[0]
    assert math.isclose(metrics["grad_norm"], before, rel_tol=1e-5)
    assert metrics["skipped_step"] == 0.0


def test_lr_schedules():
    # warmup of 4 steps: 1/4, 2/4, 3/4, 4/4 of the peak, then constant
    assert [lr_lambda(s, 4, 10, "constant", 0.0, 0.5) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # cosine after warmup 2 over 10 total: halfway through the 8 decay steps (step 6) is the midpoint
    # between 1 and the floor 0.1: 0.1 + 0.9 * 0.5 = 0.55; at the end it reaches the floor
    assert math.isclose(lr_lambda(6, 2, 10, "cosine", 0.1, 0.5), 0.55)
    assert math.isclose(lr_lambda(10, 2, 10, "cosine", 0.1, 0.5), 0.1)
    with pytest.raises(ValueError, match="warmup_style"):
        lr_lambda(5, 0, 10, "linear-ish", 0.0, 0.5)


def _engine_on_a_gpu_machine_pinned_to_cpu(rank, world_size, model_dir):
    # torch says a GPU is there; this rank's launcher (the spmd helper) said cpu
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: world_size
    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-3))
    logits = engine.module(input_ids=torch.arange(10).view(1, 10)).logits
    logits.float().pow(2).mean().backward()
    engine.clip_and_step()
    devices = {p.device.type for p in engine.module.parameters()}
    return str(engine.device), engine.mesh.device_type, devices, torch.distributed.get_backend()


def test_an_engine_pinned_to_cpu_stays_there_where_torch_sees_a_gpu(tiny_model_dir):
    results = run_on_ranks(_engine_on_a_gpu_machine_pinned_to_cpu, 2, str(tiny_model_dir))
    assert results == [("cpu", "cpu", {"cpu"}, "gloo")] * 2


def _accumulate(rank, world_size, model_dir):
    """Three micro-batches of one global batch through gradient_sync, against the whole batch at once."""
    from torch.distributed.tensor import DTensor

    ids = torch.randint(0, 300, (6, 10), generator=torch.Generator().manual_seed(2)).chunk(world_size)[rank]
    grads, gathered_between = {}, []
    for split in (1, 3):
        torch.manual_seed(0)
        engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-3))
        parts = ids.chunk(split)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            with engine.gradient_sync(last):
                loss = engine.module(input_ids=part).logits.float().logsumexp(-1).sum() / ids.numel()
                loss.backward()
            if split == 3:  # between micro-batches: still gathered (a plain tensor) or resharded (a DTensor)?
                weight = engine.module.model.layers[0].self_attn.q_proj.weight
                gathered_between.append(not isinstance(weight, DTensor))
        grads[split] = {name: p.grad.full_tensor().clone() for name, p in engine.module.named_parameters()}
    return {"gathered_between": gathered_between, "grads": grads}


def test_one_rank_keeps_its_parameters_gathered_through_an_accumulation(tiny_model_dir):
    one = run_on_ranks(_accumulate, 1, str(tiny_model_dir))[0]
    assert one["gathered_between"] == [True, True, False]  # resharded by the last micro-batch's backward
    for name, grad in one["grads"][1].items():
        torch.testing.assert_close(one["grads"][3][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # several ranks reshard after every micro-batch (holding would cost a gathered copy per rank)
    two = run_on_ranks(_accumulate, 2, str(tiny_model_dir))
    assert two[0]["gathered_between"] == [False, False, False]
    for name, grad in two[0]["grads"][1].items():
        torch.testing.assert_close(two[0]["grads"][3][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def _units(rank, world_size, model_dir):
    from torch.distributed.fsdp import FSDPModule

    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-3))
    return [name for name, m in engine.module.named_modules() if isinstance(m, FSDPModule)]


def test_one_rank_wraps_the_root_only_and_several_ranks_each_layer(tiny_model_dir):
    # one rank has nothing to shard: per-layer units would only add hooks to every forward and backward
    assert run_on_ranks(_units, 1, str(tiny_model_dir))[0] == [""]
    layers = load_causal_lm(tiny_model_dir).config.num_hidden_layers
    assert run_on_ranks(_units, 2, str(tiny_model_dir))[0] == ["", *(f"model.layers.{i}" for i in range(layers))]


def _two_adamw_steps(rank, world_size, model_dir):
    torch.manual_seed(0)
    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-2, weight_decay=0.1),
                        grad_clip=None)
    before = {name: p.full_tensor().clone() for name, p in engine.module.named_parameters()}
    grads = []
    for step in range(2):
        ids = torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(step))
        engine.module(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        grads.append({name: p.grad.full_tensor().clone() for name, p in engine.module.named_parameters()})
        engine.clip_and_step()
    after = {name: p.full_tensor().clone() for name, p in engine.module.named_parameters()}
    return engine.optimizer.defaults["fused"], before, grads, after


def test_the_cpu_optimizer_is_adamw_fused_and_steps_as_adamw(tiny_model_dir):
    fused, before, grads, after = run_on_ranks(_two_adamw_steps, 1, str(tiny_model_dir))[0]
    assert fused is True  # torch's fused CPU kernel, not its per-op default
    # the same two steps by torch's reference (single-tensor) AdamW on plain tensors
    params = {name: torch.nn.Parameter(value.clone()) for name, value in before.items()}
    reference = torch.optim.AdamW(params.values(), lr=1e-2, weight_decay=0.1, foreach=False)
    for step_grads in grads:
        for name, param in params.items():
            param.grad = step_grads[name]
        reference.step()
    for name, param in params.items():
        torch.testing.assert_close(after[name], param.detach(), rtol=1e-5, atol=1e-6, msg=name)


def _linear_classes(rank, world_size, model_dir):
    from torch import nn

    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig())
    return sorted({type(m).__name__ for m in engine.module.modules() if isinstance(m, nn.Linear)})


def test_an_engine_on_a_cpu_computes_its_linears_through_onednn(tiny_model_dir):
    from hybridrl.models.onednn_linear import onednn_fp32_supported

    if not onednn_fp32_supported():
        pytest.skip("oneDNN fp32 linears need an x86-64 CPU and a torch build with oneDNN")
    assert run_on_ranks(_linear_classes, 1, str(tiny_model_dir)) == [["OneDNNLinear"]]


def _buffer_dtypes(rank, world_size, model_dir, buffer_dtype):
    from hybridrl.workers.config import MixedPrecisionConfig

    config = FSDPConfig(mixed_precision=MixedPrecisionConfig(buffer_dtype=buffer_dtype))
    engine = FSDPEngine(load_causal_lm(model_dir), config, OptimConfig(lr=1e-3))
    return {name: buffer.dtype for name, buffer in engine.module.named_buffers() if buffer.is_floating_point()}


def test_verls_buffer_dtype_casts_the_floating_buffers_and_null_leaves_them_as_loaded(tiny_model_dir):
    loaded = {name: b.dtype for name, b in load_causal_lm(tiny_model_dir).named_buffers() if b.is_floating_point()}
    assert loaded  # the rotary frequencies
    assert run_on_ranks(_buffer_dtypes, 1, str(tiny_model_dir), None)[0] == loaded
    assert set(run_on_ranks(_buffer_dtypes, 1, str(tiny_model_dir), "bf16")[0].values()) == {torch.bfloat16}
