"""The static-shape decoding loop (`rollout.enforce_eager=false` on a GPU), run on the CPU without a graph.

The CUDA graph itself needs a GPU; here the same loop runs step by step, forced on through
`HFRollout._graphed_decoding`, and must give what the eager loop and an independent full forward give.
"""

from __future__ import annotations

import pytest
import torch
from spmd import run_on_ranks
from transformers import Qwen2ForCausalLM

from hybridrl.workers.rollout import HFRollout
from hybridrl.workers.rollout.kv_cache import cache_keyword
from hybridrl.workers.rollout.static_decode import SlotCache, hook_free_view, prefill_mask

from .helpers import full_forward_log_probs, make_prompts

# the keyword transformers' causal LMs take their KV cache by, in the installed version
CACHE = cache_keyword(Qwen2ForCausalLM)

PAD = 0


def generate(model, tokenizer, static: bool, prompts=None, monkeypatch=None, **config):
    rollout = HFRollout(model, config, tokenizer)
    if static:
        monkeypatch.setattr(rollout, "_graphed_decoding", lambda: True)
    return rollout.generate_sequences(prompts if prompts is not None else make_prompts(tokenizer, length=16)).batch


def test_greedy_static_decoding_equals_the_eager_loop_and_a_full_forward(tiny_model, tiny_tokenizer, monkeypatch):
    # tokens 4..59 stop rows at different steps: the eager loop drops them, the static one keeps them
    config = {"response_length": 24, "do_sample": False, "stop_token_ids": list(range(4, 60))}
    eager = generate(tiny_model, tiny_tokenizer, False, **config)
    static = generate(tiny_model, tiny_tokenizer, True, monkeypatch=monkeypatch, **config)
    lengths = static["response_mask"].sum(1)
    assert 0 < int((lengths < 24).sum()) < 4, "some rows should stop early, not all"
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(static[key], eager[key]), key
    torch.testing.assert_close(static["rollout_log_probs"], eager["rollout_log_probs"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_a_full_forward_and_pads_follow_the_stop(temperature, tiny_model, tiny_tokenizer,
                                                                         monkeypatch):
    out = generate(tiny_model, tiny_tokenizer, True, monkeypatch=monkeypatch, response_length=24, n=4,
                   temperature=temperature, stop_token_ids=list(range(4, 40)))
    assert out["responses"].shape == (16, 24)
    expected = full_forward_log_probs(tiny_model, _as_proto(out), temperature) * out["response_mask"]
    assert (out["rollout_log_probs"] - expected).abs().max().item() <= 1e-5
    for row, length in enumerate(out["response_mask"].sum(1).tolist()):
        assert (out["responses"][row, length:] == PAD).all() and (out["rollout_log_probs"][row, length:] == 0).all()
        if length < 24:  # it ended on a stop token: EOS (3) or one of 4..39
            assert 3 <= int(out["responses"][row, length - 1]) < 40


def test_without_stops_the_samples_are_the_eager_loops(tiny_model, tiny_tokenizer, monkeypatch):
    # no row finishes, so the eager loop drops none and both draw from the generator in the same order
    config = {"response_length": 16, "n": 3, "ignore_eos": True, "seed": 5}
    eager = generate(tiny_model, tiny_tokenizer, False, **config)
    static = generate(tiny_model, tiny_tokenizer, True, monkeypatch=monkeypatch, **config)
    assert torch.equal(static["responses"], eager["responses"])
    torch.testing.assert_close(static["rollout_log_probs"], eager["rollout_log_probs"], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("enforce_eager", "device", "graphed"), [
    (None, "cuda", True), (False, "cuda", True), (True, "cuda", False),  # null: graphs on a GPU (measured faster)
    (None, "cpu", False), (False, "cpu", False),  # a CPU always decodes eagerly
])
def test_which_loop_decodes(enforce_eager, device, graphed, tiny_model, tiny_tokenizer, monkeypatch):
    config = {} if enforce_eager is None else {"enforce_eager": enforce_eager}
    rollout = HFRollout(tiny_model, config, tiny_tokenizer)
    assert rollout.config.enforce_eager is enforce_eager
    monkeypatch.setattr(rollout, "_device", lambda: torch.device(device))
    assert rollout._graphed_decoding() is graphed


def test_hook_free_view_shares_the_parameters_and_drops_the_hooks(tiny_model):
    calls = []
    handle = tiny_model.model.layers[0].register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        view = hook_free_view(tiny_model)
        assert type(view) is type(tiny_model)
        assert all(a is b for a, b in zip(view.parameters(), tiny_model.parameters(), strict=True))
        ids = torch.tensor([[5, 6, 7, 8]])
        with torch.no_grad():
            assert torch.equal(view(input_ids=ids).logits, tiny_model(input_ids=ids).logits)
        assert len(calls) == 1  # the original's hook ran for the original's forward only
    finally:
        handle.remove()


def test_prefill_mask_is_causal_over_each_prompts_tokens_and_closed_beyond():
    attention_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    mask = prefill_mask(attention_mask, max_len=6, dtype=torch.float32)  # (2, 1, 4, 6)
    opened = mask[:, 0] == 0
    assert opened.shape == (2, 4, 6)
    expected_row0 = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(opened[0, :, :4], expected_row0)
    assert torch.equal(opened[1, :, :4], torch.ones(4, 4, dtype=torch.bool).tril())
    assert not opened[:, :, 4:].any()
    assert (mask[~(mask == 0)] == torch.finfo(torch.float32).min).all()  # finite: no NaN for padding queries


def test_slot_cache_writes_where_its_slots_tensor_points():
    cache = SlotCache(num_layers=1, max_len=5)
    cache.slots = torch.tensor([0, 1])
    keys, _ = cache.layers[0].update(torch.ones(2, 1, 2, 3), torch.ones(2, 1, 2, 3))
    cache.slots = torch.tensor([3])
    keys, values = cache.layers[0].update(torch.full((2, 1, 1, 3), 7.0), torch.full((2, 1, 1, 3), 7.0))
    assert keys.shape == (2, 1, 5, 3)
    assert keys[:, :, :2].eq(1).all() and keys[:, :, 2].eq(0).all() and keys[:, :, 3].eq(7).all()
    assert keys[:, :, 4].eq(0).all()  # unwritten slots stay zero
    assert cache.layers[0].get_mask_sizes(1) == (5, 0)


@pytest.mark.parametrize("attention", ["sdpa", "eager", "grouped_sdpa"])  # grouped_sdpa: what a GPU decodes with
def test_a_decoding_step_traces_as_one_graph_without_host_work(tiny_model_dir, attention):
    # A CUDA graph records device work only: a step that branched on a tensor's value or read one back
    # on the host could not be captured. torch.compile's tracer breaks its graph at exactly such places,
    # so one graph with no break, here on the CPU, says the GPU capture will meet none.
    from hybridrl.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir, dtype="float32").eval()
    model.set_attn_implementation(attention)
    prompt_len, max_len, rows = 8, 16, 4
    attention_mask = torch.ones(rows, prompt_len, dtype=torch.long)
    attention_mask[0, :3] = 0
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    cache, view = SlotCache(model.config.num_hidden_layers, max_len), hook_free_view(model)
    with torch.no_grad():
        cache.slots = torch.arange(prompt_len)
        view(input_ids=torch.randint(4, 500, (rows, prompt_len)), position_ids=positions, **{CACHE: cache},
             attention_mask=prefill_mask(attention_mask, max_len, torch.float32), use_cache=True)
        cache.slots = torch.full((1,), prompt_len)
        step_mask = prefill_mask(attention_mask, max_len, torch.float32)[:, :, -1:].clone()
        step_mask[..., prompt_len] = 0.0

        def step():
            return view(input_ids=torch.zeros(rows, 1, dtype=torch.long), attention_mask=step_mask,
                        position_ids=positions[:, -1:] + 1, **{CACHE: cache}, use_cache=True,
                        logits_to_keep=1).logits

        try:
            explained = torch._dynamo.explain(step)()
        finally:
            torch._dynamo.reset()  # no compiled code or guards left behind for later tests
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


def _fsdp_static_equals_eager(rank, world_size, model_dir):
    from hybridrl.models.loading import load_causal_lm, load_tokenizer
    from hybridrl.workers.config import FSDPConfig, OptimConfig
    from hybridrl.workers.fsdp_engine import FSDPEngine

    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-3))
    tokenizer = load_tokenizer(model_dir)
    prompts = make_prompts(tokenizer, length=16)
    out = {}
    for static in (False, True):
        rollout = HFRollout(engine.module, {"response_length": 12, "do_sample": False}, tokenizer)
        if static:
            rollout._graphed_decoding = lambda: True
        with engine.summon_full_params():
            if static:  # the view holds the gathered parameters, none of FSDP's hooks
                view = hook_free_view(engine.module)
                assert all(a is b for a, b in zip(view.parameters(), engine.module.parameters(), strict=True))
                assert not view._forward_pre_hooks and "FSDP" not in type(view).__name__
            out[static] = rollout.generate_sequences(prompts).batch["responses"]
    return out


def test_static_decoding_serves_an_fsdp_wrapped_actor(tiny_model_dir):
    out = run_on_ranks(_fsdp_static_equals_eager, 1, str(tiny_model_dir))[0]
    assert torch.equal(out[True], out[False])


def _as_proto(batch):
    from hybridrl.protocol import DataProto

    return DataProto(batch=batch)


@pytest.mark.gpu
def test_on_the_gpu_the_graphed_loop_equals_the_eager_one(tiny_model_dir, tiny_tokenizer, caplog):
    from hybridrl.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir, dtype="float32").eval().to("cuda")
    prompts = make_prompts(tiny_tokenizer, length=16).to("cuda")
    config = {"response_length": 24, "do_sample": False, "stop_token_ids": list(range(4, 60)), "dtype": "float32"}
    eager = HFRollout(model, config, tiny_tokenizer).generate_sequences(prompts).batch
    graphed_engine = HFRollout(model, {**config, "enforce_eager": False}, tiny_tokenizer)
    assert graphed_engine._graphed_decoding()
    graphed = graphed_engine.generate_sequences(prompts).batch
    assert torch.equal(graphed["response_mask"], eager["response_mask"])
    assert torch.equal(graphed["responses"], eager["responses"])
    # sampled, several samples per prompt: the log-probs are the model's (an independent full forward)
    sampled = HFRollout(model, {**config, "do_sample": True, "n": 4, "enforce_eager": False},
                        tiny_tokenizer).generate_sequences(prompts)
    expected = full_forward_log_probs(model, sampled) * sampled.batch["response_mask"]
    assert (sampled.batch["rollout_log_probs"] - expected).abs().max().item() <= 1e-4
    # bf16 (the GPU's default dtype) captures and runs too; its rounding differs from the eager loop's
    half = HFRollout(model, {**config, "dtype": "bfloat16", "enforce_eager": False},
                     tiny_tokenizer).generate_sequences(prompts).batch
    assert half["responses"].shape == (4, 24) and torch.isfinite(half["rollout_log_probs"]).all()
    # a failed capture falls back to the eager loop, which would pass every check above
    assert not [r for r in caplog.records if "CUDA graph failed" in r.getMessage()], caplog.text
