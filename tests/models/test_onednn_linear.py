"""OneDNNLinear: fp32 linears through oneDNN agree with F.linear to fp32 rounding, forward and backward,
and every other call is F.linear itself; the decoding paths still treat converted layers as plain."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hybridrl.models.onednn_linear import (
    OneDNNLinear,
    is_plain_linear,
    onednn_fp32_supported,
    prepacked_linears,
    use_onednn_linears,
)
from hybridrl.models.tiny import build_tiny_model

pytestmark = pytest.mark.skipif(not onednn_fp32_supported(), reason="oneDNN fp32 linears need an x86-64 CPU "
                                "and a torch build with oneDNN")


def _layer(in_features: int, out_features: int, bias: bool, seed: int = 0) -> tuple[nn.Linear, OneDNNLinear]:
    torch.manual_seed(seed)
    plain = nn.Linear(in_features, out_features, bias=bias)
    converted = nn.Linear(in_features, out_features, bias=bias)
    converted.load_state_dict(plain.state_dict())
    use_onednn_linears(converted)
    return plain, converted


def _grads(layer: nn.Module, x: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.detach().clone().requires_grad_(x.requires_grad)
    out = layer(x)
    out.backward(upstream)
    grads = [x.grad] + [p.grad for p in layer.parameters() if p.requires_grad]
    return (out.detach(), *grads)


@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_every_gradient_match_float64_as_closely_as_f_linear(bias):
    plain, converted = _layer(96, 160, bias)
    assert type(converted) is OneDNNLinear
    torch.manual_seed(1)
    x = torch.randn(3, 37, 96, requires_grad=True)  # (batch, tokens, features): rows are flattened
    upstream = torch.randn(3, 37, 160)
    exact = nn.Linear(96, 160, bias=bias).double()
    exact.load_state_dict({k: v.double() for k, v in plain.state_dict().items()})
    reference = _grads(exact, x.double(), upstream.double())
    for got, mkl, want in zip(_grads(converted, x, upstream), _grads(plain, x, upstream), reference, strict=True):
        assert got.dtype == torch.float32 and got.shape == want.shape
        scale = want.abs().max().item()
        # fp32 sums of ~100-term products: both paths land within a few fp32 units of the exact value
        assert (got.double() - want).abs().max().item() <= 1e-5 * scale
        assert (mkl.double() - want).abs().max().item() <= 1e-5 * scale


def test_outputs_and_input_gradients_own_their_memory_instead_of_viewing_a_temporary():
    # FSDP2 warns when a wrapped module returns a view (an LM head's logits): none is returned here
    _, converted = _layer(32, 24, bias=True)
    x = torch.randn(2, 5, 32, requires_grad=True)
    out = converted(x)
    assert out._base is None and out.shape == (2, 5, 24) and out.is_contiguous()
    out.sum().backward()
    assert x.grad._base is None and x.grad.shape == x.shape
    with torch.no_grad():
        inferred = converted(x)
    assert inferred._base is None and torch.equal(inferred, out.detach())


def test_a_frozen_weight_gets_no_gradient_and_the_input_still_does():
    plain, converted = _layer(64, 48, bias=True)
    for layer in (plain, converted):
        layer.weight.requires_grad_(False)
    x = torch.randn(10, 64, requires_grad=True)
    upstream = torch.randn(10, 48)
    out, grad_x, grad_b = _grads(converted, x, upstream)
    ref_out, ref_grad_x, ref_grad_b = _grads(plain, x, upstream)
    assert converted.weight.grad is None
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_x, ref_grad_x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_b, ref_grad_b, rtol=1e-5, atol=1e-5)


def test_other_dtypes_and_empty_inputs_are_f_linear_bit_for_bit_and_no_grad_matches_the_grad_path():
    _, converted = _layer(32, 24, bias=True)
    x = torch.randn(5, 32)
    with torch.no_grad():
        no_grad = converted(x)
    torch.testing.assert_close(no_grad, converted(x).detach(), rtol=0, atol=0)  # same oneDNN call either way
    bf16 = converted.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    assert torch.equal(bf16(xb), F.linear(xb, bf16.weight, bf16.bias))
    empty = torch.zeros(0, 32, dtype=torch.bfloat16)
    assert bf16(empty).shape == (0, 24)


def test_a_tiny_causal_lm_converts_only_plain_linears_and_trains_as_before(tmp_path):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "m", size="1m", seed=0)
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    linears = sum(type(m) is nn.Linear for m in converted.modules())
    assert use_onednn_linears(converted) == linears > 0
    assert not any(type(m) is nn.Linear for m in converted.modules())
    assert all(is_plain_linear(m) for m in converted.modules() if isinstance(m, nn.Linear))
    assert list(converted.state_dict()) == list(plain.state_dict())
    ids = torch.randint(0, plain.config.vocab_size, (4, 20))
    losses = []
    for model in (plain, converted):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), converted.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    # decoding still packs every converted linear, as it packs nn.Linear
    with torch.no_grad(), prepacked_linears(converted) as packed:
        assert packed == linears

