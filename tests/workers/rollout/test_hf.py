"""HFRollout on the tiny Qwen2 model: layout, EOS, n-sample order, greedy parity, log-probs, seeding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from spmd import run_on_ranks

from hybridrl.protocol import DataProto
from hybridrl.workers.rollout import HFRollout, RolloutConfig, build_rollout
from hybridrl.workers.rollout.sampling import processed_log_probs

from .helpers import full_forward_log_probs, make_prompts

PAD, EOS = 0, 3


def engine(model, tokenizer, **config) -> HFRollout:
    return HFRollout(model, config, tokenizer)


def test_layout_shapes_padding_and_interleaved_samples(tiny_model, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, length=16)
    prompts.non_tensor_batch["uid"] = np.array(["a", "b", "c", "d"], dtype=object)
    # tokens 4..59 stop a response too, so rows end at different steps (and leave the batch early)
    rollout = engine(tiny_model, tiny_tokenizer, response_length=12, n=3, stop_token_ids=list(range(4, 60)))
    out = rollout.generate_sequences(prompts)
    b = out.batch
    assert b["responses"].shape == (12, 12) and b["input_ids"].shape == (12, 28)
    expected_prompts = prompts.batch["input_ids"].repeat_interleave(3, dim=0)  # rows a,a,a,b,b,b,...
    assert torch.equal(b["prompts"], expected_prompts)
    assert list(out.non_tensor_batch["uid"]) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    prompt_mask = prompts.batch["attention_mask"].repeat_interleave(3, dim=0)
    assert torch.equal(b["attention_mask"], torch.cat([prompt_mask, b["response_mask"]], dim=1))
    # response positions continue from each row's last prompt position: last + 1, ..., last + 12
    last = prompts.batch["position_ids"][:, -1].repeat_interleave(3)
    assert torch.equal(b["position_ids"][:, 16:], last[:, None] + torch.arange(1, 13)[None, :])
    lengths = b["response_mask"].sum(1)
    assert 0 < int((lengths < 12).sum()) < 12, "the seed should make some rows stop early, not all"
    for row, length in enumerate(lengths.tolist()):
        mask = b["response_mask"][row]
        assert mask[:length].all() and not mask[length:].any(), "mask is 1 then 0, never 1 again"
        assert (b["responses"][row, length:] == PAD).all()
        assert (b["rollout_log_probs"][row, length:] == 0).all()
        if length < 12:  # an early stop ends with a stop token, and nothing before it is one
            assert 4 <= int(b["responses"][row, length - 1]) < 60
        assert not ((b["responses"][row, : length - 1] >= 4) & (b["responses"][row, : length - 1] < 60)).any()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_equals_model_generate(arch, tiny_model, tiny_llama_dir, tiny_tokenizer):
    from hybridrl.models.loading import load_causal_lm

    model = tiny_model if arch == "qwen2" else load_causal_lm(tiny_llama_dir).eval()
    prompts = make_prompts(tiny_tokenizer, length=16)
    out = engine(model, tiny_tokenizer, response_length=32, do_sample=False).generate_sequences(prompts)
    reference = model.generate(
        input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"],
        do_sample=False, max_new_tokens=32, pad_token_id=PAD, eos_token_id=EOS,
    )[:, 16:]  # (4, <=32)
    assert torch.equal(out.batch["responses"][:, : reference.shape[1]], reference)
    # greedy log-probs are the model's plain log-softmax (temperature 1, no filtering)
    expected = full_forward_log_probs(model, out) * out.batch["response_mask"]
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-5, rtol=0)


def test_eos_ends_response_and_later_tokens_are_pad(tiny_model, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, length=16)
    free = engine(tiny_model, tiny_tokenizer, response_length=20, do_sample=False)
    free_run = free.generate_sequences(prompts).batch["responses"]  # (4, 20), no EOS seen
    # Declare as EOS the token row 0 produces at step 5: row 0 must stop right after it (length 6),
    # and every row's length is its first occurrence of that token + 1 (or 20 if it never appears).
    eos = int(free_run[0, 5])
    hits = free_run == eos
    expected_len = torch.where(hits.any(1), hits.int().argmax(1) + 1, torch.tensor(20))
    out = free.generate_sequences(make_prompts(tiny_tokenizer, length=16, eos_token_id=eos)).batch
    assert int(expected_len[0]) <= 6
    assert torch.equal(out["response_mask"].sum(1), expected_len)
    for row, length in enumerate(expected_len.tolist()):
        assert torch.equal(out["responses"][row, :length], free_run[row, :length])
        assert (out["responses"][row, length:] == PAD).all() and not out["response_mask"][row, length:].any()
    # ignore_eos keeps going past it
    ignoring = engine(tiny_model, tiny_tokenizer, response_length=20, do_sample=False, ignore_eos=True)
    kept = ignoring.generate_sequences(make_prompts(tiny_tokenizer, length=16, eos_token_id=eos)).batch
    assert torch.equal(kept["responses"], free_run) and bool(kept["response_mask"].all())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_equal_full_forward(temperature, tiny_model, tiny_tokenizer):
    rollout = engine(
        tiny_model, tiny_tokenizer, response_length=24, n=4, temperature=temperature,
        stop_token_ids=list(range(4, 40)),
    )
    out = rollout.generate_sequences(make_prompts(tiny_tokenizer, length=16))
    expected = full_forward_log_probs(tiny_model, out, temperature) * out.batch["response_mask"]
    diff = (out.batch["rollout_log_probs"] - expected).abs().max().item()
    assert diff <= 1e-5, diff


def test_log_probs_follow_top_k_top_p_filtering(tiny_model, tiny_tokenizer):
    rollout = engine(tiny_model, tiny_tokenizer, response_length=16, n=2, temperature=0.8, top_k=30, top_p=0.9)
    out = rollout.generate_sequences(make_prompts(tiny_tokenizer, length=16))
    prompt_len = 16
    with torch.no_grad():
        logits = tiny_model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                            position_ids=out.batch["position_ids"]).logits[:, prompt_len - 1 : -1]
    rows, width, vocab = logits.shape
    filtered = processed_log_probs(logits.reshape(-1, vocab), 0.8, 30, 0.9).reshape(rows, width, vocab)
    expected = filtered.gather(-1, out.batch["responses"][..., None]).squeeze(-1)
    assert torch.isfinite(expected).all(), "every sampled token lies inside the top-k/top-p set"
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-5, rtol=0)
    # filtering renormalises: each chosen token is at least as likely as under the plain tempered softmax
    plain = full_forward_log_probs(tiny_model, out, 0.8)
    assert bool((out.batch["rollout_log_probs"] >= plain - 1e-6).all())


def test_seeded_sampling_is_reproducible(tiny_model, tiny_tokenizer):
    def run(seed: int) -> torch.Tensor:
        rollout = engine(tiny_model, tiny_tokenizer, response_length=10, n=2, seed=seed)
        return rollout.generate_sequences(make_prompts(tiny_tokenizer)).batch["responses"]

    assert torch.equal(run(7), run(7))
    assert not torch.equal(run(7), run(8))
    # a per-call seed restarts the sampler: the same call twice on one engine gives the same samples
    rollout = engine(tiny_model, tiny_tokenizer, response_length=10, n=2, seed=0)
    first = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=3)).batch["responses"]
    again = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=3)).batch["responses"]
    assert torch.equal(first, again)


def test_decoding_makes_every_tensor_on_the_prompts_device(tiny_model, tiny_tokenizer):
    # No GPU here: under torch.device("meta") a tensor made without naming a device lands on meta, and
    # fails the first time it meets a prompt or model tensor or its values are read, as a CPU tensor
    # fails beside CUDA ones. A third of the vocabulary stops a row, so the loop drops finished rows too.
    rollout = engine(tiny_model, tiny_tokenizer, response_length=10, n=2, stop_token_ids=list(range(4, 170)))
    expected = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=3))
    prompts = make_prompts(tiny_tokenizer, seed=3)
    with torch.device("meta"):
        got = rollout.generate_sequences(prompts)
    assert {t.device.type for t in got.batch.values()} == {"cpu"}
    lengths = got.batch["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()  # the first rows to stop left the batch while others went on
    for key in ("responses", "response_mask", "rollout_log_probs"):
        torch.testing.assert_close(got.batch[key], expected.batch[key], rtol=0, atol=0, msg=key)


def test_validate_uses_val_kwargs_and_greedy_forces_one_sample(tiny_model, tiny_tokenizer):
    rollout = engine(tiny_model, tiny_tokenizer, response_length=8, n=4, val_kwargs={"n": 2, "do_sample": True,
                                                                                  "temperature": 1.0})
    assert len(rollout.generate_sequences(make_prompts(tiny_tokenizer, validate=True))) == 8  # 4 prompts x 2
    assert len(rollout.generate_sequences(make_prompts(tiny_tokenizer, do_sample=False))) == 4
    assert len(rollout.generate_sequences(make_prompts(tiny_tokenizer))) == 16


def test_restores_train_mode_and_registry_builds_hf(tiny_model, tiny_tokenizer):
    rollout = build_rollout(RolloutConfig(response_length=4), module=tiny_model, tokenizer=tiny_tokenizer)
    assert isinstance(rollout, HFRollout)
    tiny_model.train()
    try:
        rollout.generate_sequences(make_prompts(tiny_tokenizer))
        assert tiny_model.training
    finally:
        tiny_model.eval()


def test_bad_prompts_raise_clear_errors(tiny_model, tiny_tokenizer):
    rollout = engine(tiny_model, tiny_tokenizer, response_length=4)
    prompts = make_prompts(tiny_tokenizer)
    right_padded = prompts.batch["attention_mask"].flip(1)
    prompts.batch["attention_mask"] = right_padded
    with pytest.raises(ValueError, match="LEFT-padded"):
        rollout.generate_sequences(prompts)
    prompts.pop(batch_keys=["position_ids"])
    with pytest.raises(KeyError, match="position_ids"):
        rollout.generate_sequences(prompts)


def test_bf16_rollout_casts_a_copy_and_restores_fp32_weights(tiny_model, tiny_model_dir, tiny_tokenizer):
    from hybridrl.models.loading import load_causal_lm

    before = {name: p.detach().clone() for name, p in tiny_model.named_parameters()}
    prompts = make_prompts(tiny_tokenizer, length=16)
    out = engine(tiny_model, tiny_tokenizer, response_length=16, n=2, dtype="bfloat16", seed=5)
    out = out.generate_sequences(prompts).batch
    for name, p in tiny_model.named_parameters():  # the trainer's fp32 weights come back bit for bit
        assert p.dtype == torch.float32 and torch.equal(p, before[name]), name
    # the same sampling on a model loaded in bf16 is the same computation: identical tokens and log-probs
    bf16_model = load_causal_lm(tiny_model_dir, dtype="bfloat16").eval()
    ref = engine(bf16_model, tiny_tokenizer, response_length=16, n=2, dtype="bfloat16", seed=5)
    ref = ref.generate_sequences(prompts).batch
    assert torch.equal(out["responses"], ref["responses"])
    assert torch.equal(out["rollout_log_probs"], ref["rollout_log_probs"])
    # and they are bf16-close to the fp32 model's own log-probs of those tokens (bf16 keeps ~3 digits)
    fp32 = full_forward_log_probs(tiny_model, DataProto.from_dict(dict(out))) * out["response_mask"]
    diff = (out["rollout_log_probs"] - fp32).abs().max().item()
    assert 0 < diff < 0.1, diff  # > 0: the rollout really ran in bf16


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decoding_on_cpu_runs_packed_linears_and_samples_what_plain_ones_do(dtype, tiny_model, tiny_tokenizer,
                                                                            monkeypatch):
    import contextlib

    from hybridrl.models.onednn_linear import packing_supported
    from hybridrl.workers.rollout import hf

    if not packing_supported(torch.zeros(2, 2, dtype=getattr(torch, dtype))):
        pytest.skip(f"no oneDNN {dtype} linear here (x86-64 CPUs with oneDNN only)")
    prompts = make_prompts(tiny_tokenizer, length=16)
    down_proj = tiny_model.model.layers[0].mlp.down_proj
    packed_calls = []
    hook = down_proj.register_forward_pre_hook(lambda m, args: packed_calls.append("forward" in m.__dict__))
    try:
        packed = engine(tiny_model, tiny_tokenizer, response_length=12, n=3, dtype=dtype, seed=7)
        packed = packed.generate_sequences(prompts).batch
        assert packed_calls and all(packed_calls)  # the prefill and every step ran on the pack
        monkeypatch.setattr(hf, "prepacked_linears", lambda module: contextlib.nullcontext(0))
        packed_calls.clear()
        plain = engine(tiny_model, tiny_tokenizer, response_length=12, n=3, dtype=dtype, seed=7)
        plain = plain.generate_sequences(prompts).batch
        assert packed_calls and not any(packed_calls)
    finally:
        hook.remove()
    assert not any("forward" in m.__dict__ for m in tiny_model.modules())  # nothing left patched
    assert torch.equal(packed["responses"], plain["responses"])
    if dtype == "bfloat16":  # the same arithmetic
        assert torch.equal(packed["rollout_log_probs"], plain["rollout_log_probs"])
    else:  # oneDNN's fp32 sums in place of MKL's
        torch.testing.assert_close(packed["rollout_log_probs"], plain["rollout_log_probs"], rtol=0, atol=1e-5)


def test_half_precision_decoding_on_cpu_runs_eager_attention_and_restores_sdpa(tiny_model, tiny_tokenizer):
    from hybridrl.models.attention import attention_for_decoding

    assert tiny_model.config._attn_implementation == "sdpa"  # the loader's default
    seen = []
    hook = tiny_model.register_forward_pre_hook(lambda m, args: seen.append(m.config._attn_implementation))
    try:
        engine(tiny_model, tiny_tokenizer, response_length=4, dtype="bfloat16").generate_sequences(
            make_prompts(tiny_tokenizer, length=16))
        assert set(seen) == {"grouped_eager"}
        seen.clear()
        engine(tiny_model, tiny_tokenizer, response_length=4).generate_sequences(make_prompts(tiny_tokenizer, length=16))
        assert set(seen) == {"grouped_sdpa"}  # fp32 decodes with sdpa (grouped), the faster kernel there
    finally:
        hook.remove()
    assert tiny_model.config._attn_implementation == "sdpa"
    # a model trained in bf16 on a CPU runs eager; an fp32 rollout over it decodes with (grouped) sdpa
    tiny_model.set_attn_implementation("eager")
    try:
        with attention_for_decoding(tiny_model, torch.float32):
            assert tiny_model.config._attn_implementation == "grouped_sdpa"
        assert tiny_model.config._attn_implementation == "eager"
    finally:
        tiny_model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError), attention_for_decoding(tiny_model, torch.bfloat16):
        raise RuntimeError("the implementation comes back on an error too")
    assert tiny_model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("static", [False, True])
def test_padding_every_prompt_shares_changes_nothing_but_the_prompt_columns(static, tiny_model, tiny_tokenizer):
    # the same prompts left-padded to 16 and to 48 columns: 32+ leading columns are padding in every row
    short, long = (make_prompts(tiny_tokenizer, length=width, seed=11) for width in (16, 48))
    rollout = engine(tiny_model, tiny_tokenizer, response_length=10, n=2, enforce_eager=not static)
    if static:
        rollout._graphed_decoding = lambda: True  # the static loop, without a graph on the CPU
    widths, decode = [], rollout._decode
    rollout._decode = lambda input_ids, *args: widths.append(input_ids.shape[1]) or decode(input_ids, *args)
    out_short, out_long = (rollout.generate_sequences(p).batch for p in (short, long))
    longest = int(short.batch["attention_mask"].sum(1).max())
    assert widths == [longest, longest]  # both decode the longest prompt's columns only
    assert out_long["prompts"].shape == (8, 48)
    assert torch.equal(out_long["prompts"], long.batch["input_ids"].repeat_interleave(2, dim=0))
    assert torch.equal(out_long["responses"], out_short["responses"])
    assert torch.equal(out_long["response_mask"], out_short["response_mask"])
    torch.testing.assert_close(out_long["rollout_log_probs"], out_short["rollout_log_probs"], atol=1e-5, rtol=0)
    # the layout is the padded one: the sampled log-probs are the full forward's over all 48 + 10 columns
    expected = full_forward_log_probs(tiny_model, DataProto(batch=out_long)) * out_long["response_mask"]
    torch.testing.assert_close(out_long["rollout_log_probs"], expected, atol=1e-5, rtol=0)


def test_prompt_trim_keeps_every_attended_column():
    # what generate_sequences decodes from: the actor's column trim, over prompts alone (no response columns)
    from hybridrl.workers.micro_batch import trim_columns

    def prompt_batch(ids, mask, positions):
        return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions})

    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    ids = torch.arange(10).view(2, 5)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    trimmed = trim_columns(prompt_batch(ids, mask, positions), response_length=0)
    trimmed = (trimmed.input_ids, trimmed.attention_mask, trimmed.position_ids)
    assert [t.tolist() for t in trimmed] == [[[2, 3, 4], [7, 8, 9]], [[0, 1, 1], [1, 1, 1]], [[0, 0, 1], [0, 1, 2]]]
    unpadded = torch.ones(2, 3, dtype=torch.long)
    kept = trim_columns(prompt_batch(unpadded, unpadded, unpadded), response_length=0)
    # nothing to drop: the same memory, not a copy
    assert all(t.data_ptr() == unpadded.data_ptr() and torch.equal(t, unpadded)
               for t in (kept.input_ids, kept.attention_mask, kept.position_ids))


def _fsdp_decoding_skips_the_hooks(rank, world_size, model_dir):
    from torch.distributed.fsdp import FSDPModule

    from hybridrl.models.loading import load_causal_lm, load_tokenizer
    from hybridrl.workers.config import FSDPConfig, OptimConfig
    from hybridrl.workers.fsdp_engine import FSDPEngine
    from hybridrl.workers.rollout.static_decode import decoding_module

    plain = load_causal_lm(model_dir)
    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-3))
    tokenizer = load_tokenizer(model_dir)
    prompts = make_prompts(tokenizer, length=16)
    config = {"response_length": 12, "n": 2, "seed": 5, "stop_token_ids": list(range(4, 60))}
    assert decoding_module(plain) is plain
    pre_forward_calls = []
    with engine.summon_full_params():
        view = decoding_module(engine.module)
        assert not any(isinstance(m, FSDPModule) for m in view.modules())
        assert all(a is b for a, b in zip(view.parameters(), engine.module.parameters(), strict=True))
        engine.module.model.layers[0].register_forward_pre_hook(lambda *args: pre_forward_calls.append(1))
        wrapped = HFRollout(engine.module, config, tokenizer).generate_sequences(prompts).batch
    expected = HFRollout(plain, config, tokenizer).generate_sequences(prompts).batch
    return {"calls": len(pre_forward_calls), "same_tokens": torch.equal(wrapped["responses"], expected["responses"]),
            "log_prob_gap": (wrapped["rollout_log_probs"] - expected["rollout_log_probs"]).abs().max().item()}


def test_an_fsdp_wrapped_actor_decodes_without_its_hooks_and_as_the_plain_model(tiny_model_dir):
    out = run_on_ranks(_fsdp_decoding_skips_the_hooks, 1, str(tiny_model_dir))[0]
    assert out["calls"] == 0  # a hook on the wrapped layer never fired: the loop ran the hook-free view
    assert out["same_tokens"] and out["log_prob_gap"] <= 1e-5
