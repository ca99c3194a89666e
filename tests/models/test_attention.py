"""grouped_eager computes eager attention's numbers without copying key/value heads."""

import torch
from transformers import DynamicCache, Qwen2ForCausalLM

from hybridrl.models.attention import GROUPED_EAGER, GROUPED_SDPA, decoding_attention, default_attention
from hybridrl.models.loading import load_causal_lm
from hybridrl.workers.rollout.kv_cache import cache_keyword

# the keyword transformers' causal LMs take their KV cache by, in the installed version
CACHE = cache_keyword(Qwen2ForCausalLM)


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[2, :7] = 0
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


def test_grouped_eager_equals_eager_forward_and_backward(tiny_model_dir):
    eager = load_causal_lm(tiny_model_dir, attn_implementation="eager")
    grouped = load_causal_lm(tiny_model_dir, attn_implementation=GROUPED_EAGER)
    assert grouped.config.num_key_value_heads < grouped.config.num_attention_heads  # GQA: the case that matters
    ids, mask, positions = _batch()
    outputs = []
    for model in (eager, grouped):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        (logits.float().logsumexp(-1) * mask).sum().backward()
        outputs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (eager_logits, eager_grads), (grouped_logits, grouped_grads) = outputs
    torch.testing.assert_close(grouped_logits, eager_logits, rtol=0, atol=1e-5)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(grouped_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_grouped_eager_decodes_with_a_cache_as_eager_does(tiny_model_dir):
    ids, mask, positions = _batch()
    logits = []
    for implementation in ("eager", GROUPED_EAGER):
        model = load_causal_lm(tiny_model_dir, attn_implementation=implementation, dtype="bfloat16").eval()
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=positions, **{CACHE: cache}, use_cache=True)
            step_mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
            out = model(input_ids=ids[:, -1:], attention_mask=step_mask, position_ids=positions[:, -1:] + 1,
                        **{CACHE: cache}, use_cache=True)
        logits.append(out.logits.float())
    # the same bf16 products summed in the same order: equal, not merely close
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=0)


def test_grouped_sdpa_decodes_as_sdpa_and_is_sdpa_elsewhere(tiny_model_dir):
    ids, mask, positions = _batch()
    results = []
    for implementation in ("sdpa", GROUPED_SDPA):
        model = load_causal_lm(tiny_model_dir, attn_implementation=implementation)
        assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA: the case that matters
        # a training pass (many query tokens) is transformers' sdpa attention itself: same numbers
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        (logits.float().logsumexp(-1) * mask).sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=positions, **{CACHE: cache}, use_cache=True)
            step_mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
            step = model(input_ids=ids[:, -1:], attention_mask=step_mask, position_ids=positions[:, -1:] + 1,
                         **{CACHE: cache}, use_cache=True).logits
        results.append((logits.detach(), grads, step))
    (logits, grads, step), (g_logits, g_grads, g_step) = results
    assert torch.equal(g_logits, logits)
    for name, grad in grads.items():
        assert torch.equal(g_grads[name], grad), name
    # one query token: the query heads of each key/value head attend together, with nothing copied
    torch.testing.assert_close(g_step, step, rtol=0, atol=1e-5)


def test_decoding_runs_sdpa_in_its_grouped_form_wherever_it_runs_sdpa():
    assert decoding_attention(torch.float32, "cuda") == GROUPED_SDPA
    assert decoding_attention(torch.bfloat16, "cuda") == GROUPED_SDPA
    assert decoding_attention(torch.float32, "cpu") == GROUPED_SDPA
    assert decoding_attention(torch.bfloat16, "cpu") == GROUPED_EAGER  # torch's CPU sdpa is slow in bf16
    assert default_attention(torch.float32, "cuda") == "sdpa"  # training passes keep plain sdpa
