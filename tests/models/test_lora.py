"""LoRA adapters on a real tiny HF model, checked against the LoRA formula and against PEFT's own loader."""

import json

import pytest
import torch
from torch import nn

from hybridrl.models.loading import load_causal_lm
from hybridrl.models.lora import (
    LoRAError,
    LoRASettings,
    adapter_tensors,
    adapters_disabled,
    add_lora,
    load_adapter_weights,
    lora_layers,
    lora_scalings,
    merge_into_base,
    merged_for_generation,
    merged_weights,
    save_adapter,
)

IDS = torch.tensor([[5, 17, 42, 9, 101, 7], [3, 3, 64, 200, 12, 8]])


def trained_lora_model(model_dir, rank=4, alpha=8, **kwargs):
    """A LoRA model whose lora_B is non-zero, as after some training (at init B = 0 and the adapter is a no-op)."""
    model = add_lora(load_causal_lm(model_dir), LoRASettings(rank=rank, alpha=alpha, **kwargs))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    return model.eval()


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_only_the_adapters_train_in_fp32_and_start_as_the_base_model(tiny_model_dir):
    base = load_causal_lm(tiny_model_dir).eval()
    rng_before = torch.random.get_rng_state()
    model = add_lora(load_causal_lm(tiny_model_dir), LoRASettings(rank=4, alpha=8)).eval()
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the process's random stream is untouched
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if n in trainable)
    # "all-linear": every projection of every decoder layer, not the output head
    assert len(lora_layers(model)) == 7 * base.config.num_hidden_layers
    assert not any(name.startswith("lm_head") for name, _ in lora_layers(model))
    assert torch.equal(logits(model), logits(base))  # lora_B = 0: the adapter adds exactly nothing
    again = add_lora(load_causal_lm(tiny_model_dir), LoRASettings(rank=4, alpha=8))
    for (name, a), (_, b) in zip(adapter_tensors(model.named_parameters()).items(),
                                 adapter_tensors(again.named_parameters()).items(), strict=True):
        assert torch.equal(a, b), name  # every rank and every run starts from the same lora_A


def test_the_base_weights_freeze_in_the_compute_dtype(tiny_model_dir):
    model = add_lora(load_causal_lm(tiny_model_dir), LoRASettings(rank=4), base_dtype=torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}


def test_merged_weights_follow_the_lora_formula():
    weight, bias = torch.randn(6, 4), torch.randn(6)
    lora_a, lora_b = torch.randn(2, 4), torch.randn(6, 2)
    stream = [("embed.weight", torch.ones(3)), ("proj.base_layer.weight", weight), ("proj.base_layer.bias", bias),
              ("proj.lora_A.default.weight", lora_a), ("proj.lora_B.default.weight", lora_b)]
    merged = dict(merged_weights(stream, {"proj": 0.5}))
    assert list(merged) == ["embed.weight", "proj.bias", "proj.weight"]
    expected = weight + 0.5 * torch.einsum("or,ri->oi", lora_b, lora_a)
    torch.testing.assert_close(merged["proj.weight"], expected)
    assert torch.equal(merged["proj.bias"], bias)
    with pytest.raises(LoRAError, match="proj"):
        list(merged_weights(stream[:3], {"proj": 0.5}))


def test_generation_decodes_plain_linears_holding_the_merged_weights_and_restores_everything(tiny_model_dir):
    model = trained_lora_model(tiny_model_dir)
    with_adapters = logits(model)
    layers_before = dict(lora_layers(model))
    weights_before = {n: (p, p.data.clone()) for n, p in model.named_parameters()}
    with torch.no_grad(), merged_for_generation(model):
        projections = [m for n, m in model.named_modules() if n.endswith(("q_proj", "down_proj"))]
        assert projections and all(type(m) is nn.Linear for m in projections)
        merged = logits(model)
    torch.testing.assert_close(merged, with_adapters, atol=1e-5, rtol=0)
    assert dict(lora_layers(model)) == layers_before  # the same LoRA modules are back
    for name, param in model.named_parameters():
        original, value = weights_before[name]
        assert param is original and torch.equal(param.data, value), name  # bit for bit
    assert torch.equal(logits(model), with_adapters)


def test_with_adapters_disabled_the_model_is_the_base_model(tiny_model_dir):
    model = trained_lora_model(tiny_model_dir)
    base = logits(load_causal_lm(tiny_model_dir).eval())
    assert not torch.allclose(logits(model), base, atol=1e-3)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    with adapters_disabled(model):
        assert torch.equal(logits(model), base)
        # the adapters stay trainable: FSDP reads the flags at its first forward, which may be this one
        assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    assert not torch.allclose(logits(model), base, atol=1e-3)  # enabled again after the block


# PEFT's own PeftModel, built here only to read our adapters independently, reads transformers' deprecated
# `is_gradient_checkpointing`; hybridrl never builds one, so a run does not print it
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_a_saved_adapter_loads_in_peft_and_merges_to_the_same_model(tiny_model_dir, tmp_path):
    from peft import PeftModel

    model = trained_lora_model(tiny_model_dir, rank=4, alpha=12)
    expected = logits(model)
    adapters = adapter_tensors(model.state_dict().items())
    save_adapter(tmp_path / "adapter", adapters, model, str(tiny_model_dir))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 12, str(tiny_model_dir))
    # PEFT's own loader, an independent reader of the format
    peft_model = PeftModel.from_pretrained(load_causal_lm(tiny_model_dir), str(tmp_path / "adapter")).eval()
    torch.testing.assert_close(logits(peft_model), expected, atol=1e-6, rtol=0)
    # starting a run from the adapter directory (lora_adapter_path) restores the same model
    restarted = add_lora(load_causal_lm(tiny_model_dir), LoRASettings(adapter_path=str(tmp_path / "adapter")))
    assert torch.equal(logits(restarted.eval()), expected)
    # and the merged plain model computes what the adapters do
    merged = merge_into_base(load_causal_lm(tiny_model_dir).state_dict(), adapters, config)
    plain = load_causal_lm(tiny_model_dir)
    plain.load_state_dict(merged)
    torch.testing.assert_close(logits(plain.eval()), expected, atol=1e-5, rtol=0)
    assert lora_scalings(model) == {name: 3.0 for name, _ in lora_layers(model)}  # alpha / r


def test_an_adapter_of_another_shape_or_bad_settings_are_refused_by_name(tiny_model_dir, tmp_path):
    small = trained_lora_model(tiny_model_dir, rank=2, target_modules=["q_proj"])
    save_adapter(tmp_path / "q_only", adapter_tensors(small.state_dict().items()), small, None)
    with pytest.raises(LoRAError, match="does not fit"):
        load_adapter_weights(trained_lora_model(tiny_model_dir, rank=2), tmp_path / "q_only")
    with pytest.raises(LoRAError, match=r"actor_rollout_ref\.model\.lora_rank=-1"):
        LoRASettings(rank=-1).check()
    with pytest.raises(LoRAError, match=r"lora_adapter_path=.*adapter_config\.json"):
        LoRASettings(adapter_path=str(tmp_path)).check()
    with pytest.raises(LoRAError, match=r"target_modules=\['no_such_proj'\]"):
        add_lora(load_causal_lm(tiny_model_dir), LoRASettings(rank=2, target_modules=("no_such_proj",)))


def test_adapters_get_gradients_through_activation_checkpointing(tiny_model_dir):
    """verl's LoRA scripts turn gradient checkpointing on; the frozen embedding's output needs no grad."""
    model = add_lora(load_causal_lm(tiny_model_dir, gradient_checkpointing=True), LoRASettings(rank=4)).train()
    model(input_ids=IDS).logits.square().mean().backward()
    for name, param in model.named_parameters():
        if ".lora_B." in name:  # lora_A's gradient is B^T (...) = 0 while B is still 0
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        elif ".lora_A." not in name:
            assert param.grad is None, name
