"""FusedDecoder: one decoding step computed over the model's weights equals transformers' forward, the HF
engine takes it on a CPU, and it declines the models it cannot decode."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from hybridrl.models.attention import decoding_attention
from hybridrl.models.loading import load_causal_lm
from hybridrl.models.onednn_linear import packing_supported, prepacked_linears
from hybridrl.workers.rollout import HFRollout
from hybridrl.workers.rollout import hf as hf_module
from hybridrl.workers.rollout.fused_decoder import (
    FusedDecoder,
    SharedPromptKV,
    fused_decoder,
    unsupported_reason,
)
from hybridrl.workers.rollout.kv_cache import PreallocatedCache, cache_keyword

from .helpers import make_prompts

# the keyword transformers' causal LMs take their KV cache by, in the installed version
CACHE = cache_keyword(Qwen2ForCausalLM)

STEPS = 6


def _model(arch: str, dtype: torch.dtype, tiny_model, tiny_llama_dir) -> nn.Module:
    model = tiny_model if arch == "qwen2" else load_causal_lm(tiny_llama_dir)
    model = copy.deepcopy(model).to(dtype).eval()
    model.set_attn_implementation(decoding_attention(dtype, "cpu"))  # what the engine decodes with
    return model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_each_step_gives_the_logits_and_cache_of_the_models_forward(arch, dtype, tiny_model, tiny_llama_dir,
                                                                   tiny_tokenizer):
    model = _model(arch, dtype, tiny_model, tiny_llama_dir)
    prompts = make_prompts(tiny_tokenizer, length=16)  # left-padded: rows start at different columns
    input_ids, mask, positions = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    rows, prompt_len = input_ids.shape
    mask = torch.cat([mask, mask.new_ones(rows, STEPS)], dim=1)
    layers = model.config.num_hidden_layers
    caches = [PreallocatedCache(layers, prompt_len + STEPS, full_width=True) for _ in range(2)]
    # packed linears on both sides where this CPU has them, as in the engine's loop
    with torch.no_grad(), prepacked_linears(model):
        for cache in caches:
            logits = model(input_ids=input_ids, attention_mask=mask[:, :prompt_len], position_ids=positions,
                           **{CACHE: cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        decoder = FusedDecoder(model)
        position = positions[:, -1] + 1
        for step in range(STEPS):
            tokens = logits.argmax(-1)
            seen = mask[:, : prompt_len + step + 1]
            logits = model(input_ids=tokens[:, None], attention_mask=seen, position_ids=position[:, None],
                           **{CACHE: caches[0]}, use_cache=True, logits_to_keep=1).logits[:, -1]
            fused = decoder.step(tokens, position, caches[1], seen)
            assert fused.dtype == logits.dtype and fused.shape == (rows, model.config.vocab_size)
            if packing_supported(torch.zeros(2, 2, dtype=dtype)):
                # stacking [Wq; Wk; Wv] and [Wg; Wu] leaves each output element's sum as it was
                assert torch.equal(fused, logits), f"step {step}"
            else:
                torch.testing.assert_close(fused, logits, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 2e-2)
            position = position + 1
    for ref, ours in zip(caches[0].layers, caches[1].layers, strict=True):
        assert ours.length == ref.length == prompt_len + STEPS
        torch.testing.assert_close(ours.keys, ref.keys, rtol=0, atol=0 if dtype == torch.bfloat16 else 1e-6)
        torch.testing.assert_close(ours.values, ref.values, rtol=0, atol=0 if dtype == torch.bfloat16 else 1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_engine_decodes_with_it_on_a_cpu_and_samples_what_the_forward_does(dtype, tiny_model, tiny_tokenizer,
                                                                                 monkeypatch):
    steps = []
    real_step = FusedDecoder.step
    monkeypatch.setattr(FusedDecoder, "step", lambda self, *args: steps.append(1) or real_step(self, *args))
    prompts = make_prompts(tiny_tokenizer, length=16)
    # stop tokens 4..59: rows finish at different steps and leave the batch (and the cache) early
    config = dict(response_length=12, n=3, dtype=dtype, seed=11, stop_token_ids=list(range(4, 60)))
    fused = HFRollout(tiny_model, config, tiny_tokenizer).generate_sequences(prompts).batch
    assert len(steps) >= 2, "the steps after the prefill run the fused decoder"
    lengths = fused["response_mask"].sum(1)
    assert int(lengths.max()) > 1 and int((lengths < 12).sum()) > 0

    monkeypatch.setattr(hf_module, "fused_decoder", lambda model: None)  # every step through the forward
    steps.clear()
    forward = HFRollout(tiny_model, config, tiny_tokenizer).generate_sequences(prompts).batch
    assert not steps
    assert torch.equal(fused["responses"], forward["responses"])
    assert torch.equal(fused["rollout_log_probs"], forward["rollout_log_probs"])


def _qwen2(**overrides) -> Qwen2ForCausalLM:
    config = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=64, vocab_size=64)
    return Qwen2ForCausalLM(Qwen2Config(**{**config, **overrides})).eval()


def test_it_declines_what_it_cannot_decode_and_says_why(tiny_model):
    assert unsupported_reason(_qwen2()) is None and fused_decoder(_qwen2()) is not None

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0,
                                      eos_token_id=0))
    assert "model_type 'gpt2'" in unsupported_reason(gpt2) and fused_decoder(gpt2) is None

    windowed = _qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert unsupported_reason(windowed) == "a sliding window"

    flex = _qwen2()
    flex.config._attn_implementation = "flex_attention"
    assert "flex_attention" in unsupported_reason(flex)

    class AdapterLinear(nn.Linear):  # what a LoRA or quantized projection looks like: its own forward
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    wrapped = copy.deepcopy(tiny_model)
    old = wrapped.model.layers[0].self_attn.q_proj
    wrapped.model.layers[0].self_attn.q_proj = AdapterLinear(old.in_features, old.out_features)
    assert "not a plain nn.Linear" in unsupported_reason(wrapped)
    with pytest.raises(ValueError, match="FusedDecoder cannot decode this model: .*nn.Linear"):
        FusedDecoder(wrapped)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_shared_prompt_steps_give_the_logits_of_the_forward_over_per_sample_copies(arch, dtype, tiny_model,
                                                                                  tiny_llama_dir, tiny_tokenizer):
    model = _model(arch, dtype, tiny_model, tiny_llama_dir)
    n = 3
    prompts = make_prompts(tiny_tokenizer, length=16)
    input_ids, prompt_mask, positions = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    prompt_len = input_ids.shape[1]
    rows = input_ids.shape[0] * n
    mask = torch.cat([prompt_mask.repeat_interleave(n, 0), prompt_mask.new_ones(rows, STEPS)], dim=1)
    layers = model.config.num_hidden_layers
    copies = PreallocatedCache(layers, prompt_len + STEPS, full_width=True)  # the reference: n copies per prompt
    once = PreallocatedCache(layers, prompt_len, full_width=True)
    with torch.no_grad(), prepacked_linears(model):
        for cache in (copies, once):
            logits = model(input_ids=input_ids, attention_mask=prompt_mask, position_ids=positions,
                           **{CACHE: cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        copies.batch_repeat_interleave(n)
        kv = SharedPromptKV(once, prompt_mask, n, STEPS, dtype)
        decoder = FusedDecoder(model)
        logits = logits.repeat_interleave(n, 0)
        position = positions[:, -1].repeat_interleave(n) + 1
        for step in range(STEPS):
            tokens = logits.argmax(-1)
            if step == 2:  # rows 1, 4 and 5 finished: the first prompt keeps 2 samples, the second none
                keep = torch.tensor([i for i in range(mask.shape[0]) if i not in (1, 4, 5)])
                copies.batch_select_indices(keep)
                kv.select(keep)
                tokens, mask, position = tokens[keep], mask[keep], position[keep]
                assert kv.active.tolist() == [0, 2, 3] + list(range(6, rows))
                x = torch.randn(len(keep), 2, 3, 5)
                assert torch.equal(kv.by_row(kv.by_prompt(x)), x)
            logits = model(input_ids=tokens[:, None], attention_mask=mask[:, : prompt_len + step + 1],
                           position_ids=position[:, None], **{CACHE: copies}, use_cache=True,
                           logits_to_keep=1).logits[:, -1]
            shared = decoder.step_shared(tokens, position, kv)
            assert shared.dtype == logits.dtype and shared.shape == logits.shape
            # the same sums, split at the prompt's end: fp32 to rounding; bf16 within a few of its ulps
            # (the prompt's and the response's part of each attention output are rounded apart)
            tolerance = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(shared.float(), logits.float(), rtol=0, atol=tolerance, msg=f"step {step}")
            position = position + 1
    assert kv.responses.layers[0].length == STEPS
    assert once.layers[0].keys.shape[2] == prompt_len  # each prompt's keys stayed once, P wide


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_engine_shares_long_prompts_and_samples_the_models_log_probs(dtype, tiny_model, tiny_tokenizer,
                                                                        monkeypatch):
    from .helpers import full_forward_log_probs

    calls = {"shared": 0}
    real_step = FusedDecoder.step_shared
    monkeypatch.setattr(FusedDecoder, "step_shared",
                        lambda self, *args: calls.__setitem__("shared", calls["shared"] + 1) or real_step(self, *args))
    prompts = make_prompts(tiny_tokenizer, length=16)
    config = dict(response_length=12, n=3, dtype=dtype, seed=5, stop_token_ids=list(range(4, 60)))
    monkeypatch.setattr(HFRollout, "share_prompt_kv_from", 10_000)  # prompts this short: per-sample copies
    HFRollout(tiny_model, config, tiny_tokenizer).generate_sequences(prompts)
    assert calls["shared"] == 0
    monkeypatch.setattr(HFRollout, "share_prompt_kv_from", 1)
    out = HFRollout(tiny_model, config, tiny_tokenizer).generate_sequences(prompts).batch
    assert calls["shared"] >= 2
    lengths = out["response_mask"].sum(1)
    assert int((lengths < 12).sum()) > 0 and int(lengths.max()) > 3, "rows should leave the batch at different steps"
    # the sampler's log-probs are the model's: one fp32 forward over prompt + response scores the same tokens
    reference = full_forward_log_probs(tiny_model, type(prompts).from_dict(dict(out))) * out["response_mask"]
    atol = 1e-4 if dtype == "float32" else 0.1  # bf16 decoding against the fp32 model keeps ~3 digits
    torch.testing.assert_close(out["rollout_log_probs"], reference, rtol=0, atol=atol)


def test_the_engine_says_once_which_step_it_decodes_with_and_why(tiny_model, tiny_tokenizer, caplog):
    prompts = make_prompts(tiny_tokenizer, length=16)
    engine = HFRollout(tiny_model, dict(response_length=3, n=2), tiny_tokenizer)
    with caplog.at_level("INFO", logger="hybridrl.workers.rollout.hf"):
        engine.generate_sequences(prompts)
        engine.generate_sequences(prompts)
    said = [r.getMessage() for r in caplog.records if r.name == "hybridrl.workers.rollout.hf"]
    assert said == ["HF rollout: Qwen2ForCausalLM decodes with the fused step (prompts' keys/values kept once "
                    "for their samples from 32 columns)"]

    wrapped = copy.deepcopy(tiny_model)
    old = wrapped.model.layers[1].mlp.up_proj
    wrapped.model.layers[1].mlp.up_proj = type("LoraLike", (nn.Linear,), {})(old.in_features, old.out_features)
    caplog.clear()
    with caplog.at_level("INFO", logger="hybridrl.workers.rollout.hf"):
        HFRollout(wrapped, dict(response_length=3), tiny_tokenizer).generate_sequences(prompts)
    said = [r.getMessage() for r in caplog.records if r.name == "hybridrl.workers.rollout.hf"]
    assert len(said) == 1 and "decodes with its forward, not the fused step: " in said[0]
    assert "not a plain nn.Linear" in said[0]


def test_shared_prompt_kv_wants_a_prompt_cache_as_wide_as_the_prompts(tiny_model, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, length=16)
    wide = PreallocatedCache(tiny_model.config.num_hidden_layers, 16 + 8, full_width=True)
    with torch.no_grad():
        tiny_model(input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"],
                   position_ids=prompts.batch["position_ids"], **{CACHE: wide}, use_cache=True)
    with pytest.raises(ValueError, match=r"exactly as wide as the prompts \(16 columns\).*\[24\]"):
        SharedPromptKV(wide, prompts.batch["attention_mask"], 2, 8, torch.float32)
