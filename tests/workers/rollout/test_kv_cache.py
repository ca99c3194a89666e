"""PreallocatedCache against transformers' DynamicCache on the tiny Qwen2 model."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen2ForCausalLM

from hybridrl.models.attention import GROUPED_EAGER
from hybridrl.workers.rollout import kv_cache
from hybridrl.workers.rollout.kv_cache import (
    PreallocatedCache,
    PreallocatedLayer,
    cache_keyword,
    check_transformers,
)

from .helpers import make_prompts

# the keyword transformers' causal LMs take their KV cache by, in the installed version
CACHE = cache_keyword(Qwen2ForCausalLM)


def decode(model, cache, prompts, steps: int, drop_at: dict[int, list[int]] | None = None) -> list[torch.Tensor]:
    """Greedy-decode `steps` tokens after a prefill; before step s keep only rows `drop_at[s]`
    (indices into the rows still active). Returns each forward's last-position logits."""
    ids, mask, pos = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    drop_at = drop_at or {}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, **{CACHE: cache},
                       use_cache=True).logits[:, -1]  # (B, V)
        outputs = [logits]
        next_pos = pos[:, -1:] + 1  # (B, 1)
        for step in range(steps):
            token = logits.argmax(-1, keepdim=True)  # (A, 1)
            if step in drop_at:
                keep = torch.tensor(drop_at[step])
                cache.batch_select_indices(keep)
                token, mask, next_pos = token[keep], mask[keep], next_pos[keep]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            logits = model(input_ids=token, attention_mask=mask, position_ids=next_pos, **{CACHE: cache},
                           use_cache=True).logits[:, -1]
            outputs.append(logits)
            next_pos = next_pos + 1
    return outputs


@pytest.fixture(params=["sdpa", "eager", GROUPED_EAGER])
def attention(request, tiny_model):
    """The shared tiny model switched to one attention implementation for the test, then switched back."""
    before = tiny_model.config._attn_implementation
    tiny_model.set_attn_implementation(request.param)
    yield request.param
    tiny_model.set_attn_implementation(before)


@pytest.mark.parametrize("full_width", [False, True])
def test_logits_equal_dynamic_cache(tiny_model, tiny_tokenizer, attention, full_width):
    prompts = make_prompts(tiny_tokenizer, length=16)  # 4 left-padded prompts of different lengths
    layers = tiny_model.config.num_hidden_layers
    ours = decode(tiny_model, PreallocatedCache(layers, max_len=16 + 10, full_width=full_width), prompts, steps=10)
    reference = decode(tiny_model, DynamicCache(), prompts, steps=10)
    assert len(ours) == len(reference) == 11
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"step {step}")


@pytest.mark.parametrize("full_width", [False, True])
def test_dropping_rows_keeps_the_right_rows(tiny_model, tiny_tokenizer, full_width):
    prompts = make_prompts(tiny_tokenizer, length=16)
    layers = tiny_model.config.num_hidden_layers
    # before step 3 rows 0 and 2 finish (keep 1, 3); before step 6 the old row 3 finishes (keep index 0)
    drops = {3: [1, 3], 6: [0]}
    ours = decode(tiny_model, PreallocatedCache(layers, max_len=26, full_width=full_width), prompts, steps=8,
                  drop_at=drops)
    reference = decode(tiny_model, DynamicCache(), prompts, steps=8, drop_at=drops)
    assert [o.shape[0] for o in ours] == [4, 4, 4, 4, 2, 2, 2, 1, 1]
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # the survivor is prompt 1: its logits match an undisturbed run's row 1 at every step
    undisturbed = decode(tiny_model, PreallocatedCache(layers, max_len=26, full_width=full_width), prompts, steps=8)
    survivor_row = [1, 1, 1, 1, 0, 0, 0, 0, 0]  # prompt 1's row in the shrinking batch, output by output
    for a, b, row in zip(ours, undisturbed, survivor_row, strict=True):
        torch.testing.assert_close(a[row], b[1], atol=1e-5, rtol=0)


def test_layer_writes_in_place_selects_and_repeats_rows():
    layer = PreallocatedLayer(max_len=5)
    # keys hold row*10 + position, so every slot says where it came from
    first = torch.tensor([[0.0, 1.0], [10.0, 11.0]]).reshape(2, 1, 2, 1)  # (rows=2, H=1, q=2, D=1)
    keys, values = layer.update(first, -first)
    assert keys.shape == (2, 1, 2, 1) and layer.get_seq_length() == 2
    assert layer.get_mask_sizes(query_length=1) == (3, 0)  # 2 written + 1 query, offset 0
    layer.batch_repeat_interleave(2)  # rows become 0, 0, 1, 1
    step = torch.tensor([2.0, 2.0, 12.0, 12.0]).reshape(4, 1, 1, 1)
    keys, values = layer.update(step, -step)
    assert keys.flatten(1).tolist() == [[0, 1, 2], [0, 1, 2], [10, 11, 12], [10, 11, 12]]
    assert torch.equal(values, -keys)
    layer.batch_select_indices(torch.tensor([1, 3]))
    assert layer.keys.shape == (2, 1, 5, 1)  # fresh buffers keep the full length for later steps
    keys, _ = layer.update(torch.tensor([3.0, 13.0]).reshape(2, 1, 1, 1), torch.zeros(2, 1, 1, 1))
    assert keys.flatten(1).tolist() == [[0, 1, 2, 3], [10, 11, 12, 13]]


def test_full_width_layer_shows_the_whole_buffer_with_zeros_where_unwritten():
    layer = PreallocatedLayer(max_len=5, full_width=True)
    assert layer.get_mask_sizes(query_length=2) == (5, 0)  # the mask covers what attention will read
    first = torch.tensor([[1.0, 2.0], [11.0, 12.0]]).reshape(2, 1, 2, 1)  # (rows=2, H=1, q=2, D=1)
    keys, values = layer.update(first, -first)
    assert keys.shape == values.shape == (2, 1, 5, 1) and layer.get_seq_length() == 2
    assert keys.flatten(1).tolist() == [[1, 2, 0, 0, 0], [11, 12, 0, 0, 0]]
    layer.batch_repeat_interleave(2)
    layer.batch_select_indices(torch.tensor([3]))
    keys, values = layer.update(torch.tensor([13.0]).reshape(1, 1, 1, 1), torch.tensor([-13.0]).reshape(1, 1, 1, 1))
    assert keys.flatten(1).tolist() == [[11, 12, 13, 0, 0]] and torch.equal(values, -keys)
    assert keys.is_contiguous() and layer.get_mask_sizes(query_length=1) == (5, 0)


def test_overflow_names_the_fix():
    layer = PreallocatedLayer(max_len=3)
    layer.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    with pytest.raises(ValueError, match="max_len >= prompt length \\+ response length"):
        layer.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def test_growing_full_width_equals_dynamic_cache(tiny_model, tiny_tokenizer, attention, monkeypatch):
    # grow by 3 positions at a time: the 12 steps cross several growths, one right after a row drop
    monkeypatch.setattr(kv_cache, "FULL_WIDTH_GROWTH", 3)
    prompts = make_prompts(tiny_tokenizer, length=16)
    layers = tiny_model.config.num_hidden_layers
    cache = PreallocatedCache(layers, max_len=16 + 12, full_width=True)
    drops = {4: [0, 2, 3]}
    ours = decode(tiny_model, cache, prompts, steps=12, drop_at=drops)
    reference = decode(tiny_model, DynamicCache(), prompts, steps=12, drop_at=drops)
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"step {step}")
    assert cache.layers[0].keys.shape[2] == 28  # grown to max_len, never beyond


def test_full_width_layer_grows_as_written_and_says_so_before_the_write(monkeypatch):
    monkeypatch.setattr(kv_cache, "FULL_WIDTH_GROWTH", 2)
    layer = PreallocatedLayer(max_len=20, full_width=True)
    prompt = torch.arange(1.0, 5.0).reshape(1, 1, 4, 1)  # (rows=1, H=1, q=4, D=1): positions 1..4
    assert layer.get_mask_sizes(query_length=4) == (6, 0)  # 4 written + 2 spare
    keys, _ = layer.update(prompt, prompt)
    assert keys.flatten().tolist() == [1, 2, 3, 4, 0, 0]
    widths = []
    for position in range(5, 12):
        predicted = layer.get_mask_sizes(query_length=1)[0]
        keys, values = layer.update(torch.full((1, 1, 1, 1), float(position)), torch.zeros(1, 1, 1, 1))
        assert keys.shape[2] == predicted and keys.is_contiguous()
        widths.append(predicted)
    # a write past the width grows it by max(2, width // 4) beyond the write: 6 -> 9 -> 12
    assert widths == [6, 6, 9, 9, 9, 12, 12]
    assert keys.flatten().tolist() == [*range(1, 12), 0]  # every written position kept, zeros beyond
    big = PreallocatedLayer(max_len=8, full_width=True)
    assert big.get_mask_sizes(query_length=7) == (8, 0)  # never wider than max_len


def test_the_cache_goes_by_the_keyword_the_models_forward_names(tiny_model, tiny_tokenizer):
    import inspect
    import warnings

    from torch import nn

    from hybridrl.workers.rollout import HFRollout

    class Renamed(nn.Module):  # transformers >= 5.24
        def forward(self, input_ids, cache=None, **kwargs): ...

    class Older(nn.Module):  # transformers before 5.24, and models that know no other name
        def forward(self, input_ids, past_key_values=None, **kwargs): ...

    assert cache_keyword(Renamed()) == "cache" and cache_keyword(Older()) == "past_key_values"
    expected = "cache" if "cache" in inspect.signature(type(tiny_model).forward).parameters else "past_key_values"
    assert cache_keyword(tiny_model) == expected
    prompts = make_prompts(tiny_tokenizer, length=16)
    with warnings.catch_warnings():  # the deprecated alias would warn (and, from 5.40, be dropped unused)
        warnings.filterwarnings("error", message=".*past_key_values.*deprecated.*")
        HFRollout(tiny_model, dict(response_length=4, n=2), tiny_tokenizer).generate_sequences(prompts)


def test_a_transformers_older_than_the_cache_interface_is_refused_naming_the_fix():
    for old in ("4.57.6", "5.16.0", "4.51.0.dev0"):
        with pytest.raises(ImportError, match=r"needs transformers>=5.17, found .*pip install 'transformers>=5.17'"):
            check_transformers(old)
    for new in ("5.17.0", "5.24.0", "6.0.0.dev0"):
        check_transformers(new)
