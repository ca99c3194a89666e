"""A forward pass that computes each shared prompt once gives the padded pass's logits and gradients."""

import contextlib

import pytest
import torch

from hybridrl.models.attention import (
    GROUPED_EAGER,
    SharedPromptLayout,
    prompt_groups,
    shared_prompt_forward,
    shared_prompt_mode,
    supports_shared_prompt,
)
from hybridrl.models.loading import load_causal_lm
from hybridrl.models.tiny import build_tiny_model


def _grouped_rows(groups: int = 3, n: int = 4, prompt_len: int = 9, response_len: int = 7):
    """`groups` left-padded prompts of different lengths, each followed by n right-padded responses."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(5, 300, (groups, prompt_len), generator=g)
    prompt_mask = torch.ones(groups, prompt_len, dtype=torch.long)
    for u, pad in enumerate([0, 3, 6][:groups]):
        prompt_mask[u, :pad] = 0
    rows = groups * n
    responses = torch.randint(5, 300, (rows, response_len), generator=g)
    response_mask = torch.ones(rows, response_len, dtype=torch.long)
    for b in range(rows):
        response_mask[b, 1 + b % response_len:] = 0  # lengths 1..response_len
    ids = torch.cat([prompts.repeat_interleave(n, 0), responses], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(n, 0), response_mask], dim=1)
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0), response_mask.bool()


def test_prompt_groups_number_equal_prompts_by_first_appearance():
    ids = torch.tensor([[0, 7, 8], [5, 5, 6], [0, 7, 8], [9, 7, 8], [5, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1]])
    group, first = prompt_groups(ids, mask)
    # rows 0, 2, 3 hold the same real tokens (row 3's pad column holds another id): one group
    assert group.tolist() == [0, 1, 0, 0, 1]
    assert first.tolist() == [0, 1]
    # the same tokens at another offset are another prompt (positions differ)
    group, first = prompt_groups(torch.tensor([[0, 7, 8], [7, 8, 0]]), torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert group.tolist() == [0, 1] and first.tolist() == [0, 1]


@pytest.mark.parametrize("attention,arch", [("eager", "qwen2"), ("sdpa", "qwen2"), (GROUPED_EAGER, "qwen2"),
                                            ("sdpa", "llama")])
def test_logits_and_gradients_equal_the_padded_forward(tiny_model_dir, tiny_llama_dir, attention, arch):
    model_dir = tiny_model_dir if arch == "qwen2" else tiny_llama_dir
    ids, mask, positions, valid = _grouped_rows()
    prompt_len, response_len = 9, 7
    group, first = prompt_groups(ids[:, :prompt_len], mask[:, :prompt_len])
    assert group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    results = []
    for shared in (False, True):
        model = load_causal_lm(model_dir, attn_implementation=attention)
        if shared:
            logits = shared_prompt_forward(model, ids, mask, positions, prompt_len, response_len, group, first)
        else:
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            logits = logits[:, prompt_len - 1:-1]  # column t predicts token t + 1
        (logits.logsumexp(-1) * valid).sum().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
        assert model.config._attn_implementation == attention  # switched back after the call
    (padded, padded_grads), (shared_logits, shared_grads) = results
    assert shared_logits.shape == padded.shape == (12, response_len, model.config.vocab_size)
    torch.testing.assert_close(shared_logits[valid], padded[valid], rtol=0, atol=1e-5)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_model_sees_each_prompt_once(tiny_model_dir):
    ids, mask, positions, _ = _grouped_rows(groups=3, n=4)
    group, first = prompt_groups(ids[:, :9], mask[:, :9])
    model = load_causal_lm(tiny_model_dir)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape),
                                    with_kwargs=True)
    with torch.no_grad():
        shared_prompt_forward(model, ids, mask, positions, 9, 7, group, first)
    assert seen == [torch.Size([1, 3 * 9 + 12 * 7])]  # 111 tokens instead of the padded 12 x 16 = 192


def test_padding_queries_stay_finite_and_real_ones_never_see_padding():
    layout = SharedPromptLayout(torch.tensor([0, 0, 1]), torch.tensor([[0, 0, 1], [1, 1, 1]]),
                                torch.tensor([[1, 1], [1, 0], [1, 1]]), base_attention="sdpa")
    prompt, response = layout.masks(torch.float32)
    assert prompt.shape == (2, 1, 3, 3) and response.shape == (3, 1, 2, 5)
    assert prompt.any(-1).all() and response.any(-1).all()  # every query has a key: softmax is finite
    assert prompt[0, 0].tolist() == [[True, False, False], [False, True, False], [False, False, True]]
    # rows 0 and 1 read prompt 0's one real token; row 1's second response column is padding, so only
    # that padding query itself reads it (and the real column before it)
    assert response[1, 0].tolist() == [[False, False, True, True, False], [False, False, True, True, True]]
    assert response[0, 0].tolist() == [[False, False, True, True, False], [False, False, True, True, True]]
    assert response[2, 0, 1].tolist() == [True, True, True, True, True]
    additive_prompt, _ = SharedPromptLayout(layout.prompt_of_row, layout.prompt_mask, layout.response_mask,
                                            base_attention="eager").masks(torch.bfloat16)
    assert additive_prompt.dtype == torch.bfloat16
    assert (additive_prompt[0, 0, 1] == torch.finfo(torch.bfloat16).min).tolist() == [True, False, True]


def test_models_that_cannot_share_are_recognised(tmp_path, tiny_model_dir):
    assert supports_shared_prompt(load_causal_lm(tiny_model_dir, attn_implementation=GROUPED_EAGER))
    windowed = build_tiny_model(tmp_path / "windowed", size="1m")
    model = load_causal_lm(windowed, override_config={"use_sliding_window": True, "sliding_window": 4,
                                                      "max_window_layers": 0})
    assert not supports_shared_prompt(model)


def test_under_gradient_checkpointing_the_mode_held_through_backward_gives_the_padded_gradients(tiny_model_dir):
    ids, mask, positions, valid = _grouped_rows()
    group, first = prompt_groups(ids[:, :9], mask[:, :9])
    grads = []
    for shared in (False, True):
        model = load_causal_lm(tiny_model_dir, gradient_checkpointing=True)
        model.train()
        with shared_prompt_mode(model) if shared else contextlib.nullcontext():
            if shared:
                logits = shared_prompt_forward(model, ids, mask, positions, 9, 7, group, first)
            else:
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, 8:-1]
            (logits.logsumexp(-1) * valid).sum().backward()  # recomputes every layer's forward
        assert model.config._attn_implementation == "sdpa"
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
