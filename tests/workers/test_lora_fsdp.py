"""A LoRA model under the FSDP2 engine on real gloo ranks: what trains, what is saved, what the rollout gets."""

import torch
from spmd import run_on_ranks
from torch.distributed.tensor import DTensor

from hybridrl.models.loading import load_causal_lm
from hybridrl.models.lora import LoRASettings, add_lora
from hybridrl.workers.config import FSDPConfig, OptimConfig
from hybridrl.workers.fsdp_engine import FSDPEngine

IDS = torch.randint(0, 300, (4, 12), generator=torch.Generator().manual_seed(1))


def _full(value):
    return value.full_tensor() if isinstance(value, DTensor) else value


def _lora_step(rank, world_size, model_dir):
    engine = FSDPEngine(add_lora(load_causal_lm(model_dir), LoRASettings(rank=4, alpha=8)), FSDPConfig(),
                        OptimConfig(lr=1e-2), grad_clip=1.0)
    before = {k: _full(v).clone() for k, v in engine.module.state_dict().items()}
    mine = IDS.chunk(world_size)[rank]
    for _ in range(2):  # B starts at 0, so the first step moves B only and the second A too
        loss = engine.module(input_ids=mine).logits.float().logsumexp(-1).sum() / IDS.numel() * world_size
        loss.backward()
        engine.clip_and_step()
    after = {k: _full(v).clone() for k, v in engine.module.state_dict().items()}
    optimizer_params = [p for group in engine.optimizer.param_groups for p in group["params"]]
    trainable = [p for p in engine.module.parameters() if p.requires_grad]
    with torch.no_grad():
        with engine.adapters_disabled():
            base_logits = engine.module(input_ids=IDS).logits
        lora_logits = engine.module(input_ids=IDS).logits
    return {
        "before": before, "after": after,
        "optimizer_is_adapters": len(optimizer_params) == len(trainable) > 0
        and {id(p) for p in optimizer_params} == {id(p) for p in trainable},
        "state_keys": sorted(engine.sharded_state()["model"]),
        "streamed": {k: v.clone() for k, v in engine.iter_full_weights()},
        "full": engine.full_model_state_dict(),
        "base_logits": base_logits, "lora_logits": lora_logits,
    }


def test_lora_trains_only_the_adapters_on_two_ranks_as_on_one(tiny_model_dir):
    one = run_on_ranks(_lora_step, 1, str(tiny_model_dir))[0]
    two = run_on_ranks(_lora_step, 2, str(tiny_model_dir))
    plain = load_causal_lm(tiny_model_dir)
    for result in (one, *two):
        assert result["optimizer_is_adapters"]  # AdamW state exists for the adapters only
        for key, value in result["before"].items():
            changed = not torch.equal(value, result["after"][key])
            assert changed == (".lora_" in key), key  # every adapter moved, nothing else did
        # a checkpoint's model state is the adapters only (not the tied output head either)
        assert result["state_keys"] and all(".lora_A." in k or ".lora_B." in k for k in result["state_keys"])
        # the rollout and HF exports get the plain model's tensors, LoRA merged in
        assert sorted(result["streamed"]) == sorted(plain.state_dict())
        with torch.no_grad():
            # the base, to rounding (the engine computes its linears through oneDNN on a CPU)
            torch.testing.assert_close(result["base_logits"], plain(input_ids=IDS).logits, atol=1e-5, rtol=0)
            assert not torch.allclose(result["lora_logits"], result["base_logits"], atol=1e-3)
    for key in ("after", "streamed"):
        for name, value in one[key].items():
            torch.testing.assert_close(two[0][key][name], value, atol=1e-5, rtol=1e-4, msg=name)
    for name, value in one["full"].items():  # rank 0's gathered copy is the streamed one
        torch.testing.assert_close(value, one["streamed"][name], atol=0, rtol=0)
    merged = load_causal_lm(tiny_model_dir)
    merged.load_state_dict(one["full"])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=IDS).logits, one["lora_logits"], atol=1e-5, rtol=0)


def _served_merge(rank, world_size, model_dir):
    """The HF rollout's hand-off: adapters merged in place into the gathered weights, then resharded."""
    from hybridrl.models.lora import merged_for_generation

    engine = FSDPEngine(add_lora(load_causal_lm(model_dir), LoRASettings(rank=4, alpha=8)), FSDPConfig())
    with torch.no_grad():
        for name, param in engine.module.named_parameters():
            if ".lora_B." in name:  # as after training: a merge that changes the weights
                param.copy_(torch.full_like(param, 0.01))
    before = {k: _full(v).clone() for k, v in engine.module.state_dict().items()}
    with torch.no_grad():
        expected = engine.module(input_ids=IDS).logits
        with engine.summon_full_params(), merged_for_generation(engine.module, in_place=True):
            merged = engine.module(input_ids=IDS).logits
        after = {k: _full(v).clone() for k, v in engine.module.state_dict().items()}
        again = engine.module(input_ids=IDS).logits
    return {"unchanged": all(torch.equal(before[k], after[k]) for k in before), "expected": expected,
            "merged": merged, "again": again}


def test_a_merge_into_the_gathered_weights_never_reaches_the_sharded_ones(tiny_model_dir):
    for world_size in (1, 2):
        for result in run_on_ranks(_served_merge, world_size, str(tiny_model_dir)):
            assert result["unchanged"], world_size  # the sharded weights (and adapters) as before, bit for bit
            torch.testing.assert_close(result["merged"], result["expected"], atol=1e-5, rtol=0)
            assert torch.equal(result["again"], result["expected"])  # the next pass gathers the originals
