"""prepacked_linears: a CPU model's linears run on oneDNN packs of their weights, with F.linear's outputs
(bf16: bit for bit; fp32: to fp32 rounding), only while weights are fixed and no gradient is wanted, and
are left as they were afterwards."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hybridrl.models.loading import load_causal_lm
from hybridrl.models.onednn_linear import packing_supported, prepacked_linears

needs_onednn_bf16 = pytest.mark.skipif(
    not packing_supported(torch.zeros(2, 2, dtype=torch.bfloat16)),
    reason="this CPU build has no oneDNN bf16 linear (torch.ops.mkldnn._linear_pointwise)")


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


@needs_onednn_bf16
def test_a_bf16_model_gives_the_same_logits_packed_for_decoding_and_prefill_shapes(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="bfloat16").eval()
    g = torch.Generator().manual_seed(0)
    for rows, columns in [(1, 1), (24, 1), (7, 13)]:  # a decoding step's shapes and a prefill's
        ids = torch.randint(5, 200, (rows, columns), generator=g)
        with torch.no_grad():
            plain = model(input_ids=ids).logits
            with prepacked_linears(model) as packed:
                assert packed == len(_linears(model))  # every projection and the LM head
                assert all("forward" in m.__dict__ for m in _linears(model))
                inside = model(input_ids=ids).logits
        assert torch.equal(inside, plain)  # the same oneDNN arithmetic, bit for bit
    assert not any("forward" in m.__dict__ for m in _linears(model))  # every class forward is back


@needs_onednn_bf16
def test_packs_made_under_two_threads_compute_the_same_under_one(tiny_model_dir):
    """The CPU thread fit (hybridrl/utils/cpu_threads.py) may change the count between decoding steps."""
    model = load_causal_lm(tiny_model_dir, dtype="bfloat16").eval()
    ids = torch.randint(5, 200, (6, 9), generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            plain = model(input_ids=ids).logits
            torch.set_num_threads(2)
            with prepacked_linears(model):
                model(input_ids=ids)
                torch.set_num_threads(1)
                inside = model(input_ids=ids).logits
    finally:
        torch.set_num_threads(before)
    assert torch.equal(inside, plain)


@needs_onednn_bf16
def test_gradients_a_replaced_weight_and_an_updated_weight_bypass_the_pack():
    linear = nn.Linear(16, 8).to(torch.bfloat16)
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    with prepacked_linears(linear) as packed:
        assert packed == 1
        # a gradient is wanted: autograd's linear runs, and its gradient is F.linear's
        x_grad = x.clone().requires_grad_()
        linear(x_grad).float().sum().backward()
        expected = x.clone().requires_grad_()
        F.linear(expected, linear.weight, linear.bias).float().sum().backward()
        assert torch.equal(x_grad.grad, expected.grad)
        with torch.no_grad():
            linear.weight.mul_(2)  # in place: the pack is stale
            assert torch.equal(linear(x), F.linear(x, linear.weight, linear.bias))
            linear.weight.data = torch.randn(8, 16, dtype=torch.bfloat16)  # replaced: stale as well
            assert torch.equal(linear(x), F.linear(x, linear.weight, linear.bias))
            # an fp32 input is not what the bf16 pack takes: F.linear decides (and raises) as without a pack
            with pytest.raises(RuntimeError):
                linear(x.float())


needs_onednn_fp32 = pytest.mark.skipif(not packing_supported(torch.zeros(2, 2)),
                                       reason="packs are made on x86-64 CPUs with oneDNN only")


@needs_onednn_fp32
def test_an_fp32_model_gives_its_logits_to_fp32_rounding_packed(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="float32").eval()
    ids = torch.randint(5, 200, (6, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with prepacked_linears(model) as packed:
            assert packed == len(_linears(model))
            inside = model(input_ids=ids).logits
    # oneDNN's fp32 sums in place of MKL's: another order, the same precision (not bf16's ~1e-2)
    torch.testing.assert_close(inside, plain, rtol=0, atol=1e-5)


def test_half_weights_subclasses_and_patched_forwards_are_left_alone():
    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    fp16 = nn.Linear(4, 4).to(torch.float16)  # no packed fp16 linear is made: F.linear as before
    subclass = Scaled(4, 4).to(torch.bfloat16)
    patched = nn.Linear(4, 4).to(torch.bfloat16)

    def own_forward(x: torch.Tensor) -> torch.Tensor:
        return x

    patched.forward = own_forward
    with prepacked_linears(nn.ModuleList([fp16, subclass, patched])) as packed:
        assert packed == 0
        assert "forward" not in fp16.__dict__ and "forward" not in subclass.__dict__
        assert patched.forward is own_forward
    assert patched.forward is own_forward  # someone else's patch survives the block


@needs_onednn_bf16
def test_forwards_come_back_when_the_block_raises():
    linear = nn.Linear(4, 4).to(torch.bfloat16)
    with pytest.raises(ValueError), prepacked_linears(linear):
        raise ValueError("boom")
    assert "forward" not in linear.__dict__


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_a_fixed_linear_computes_f_linear_packed_where_it_can(dtype):
    from hybridrl.models.onednn_linear import FixedLinear

    g = torch.Generator().manual_seed(3)
    weight = (torch.randn(96, 64, generator=g) / 8).to(dtype)
    bias = torch.randn(96, generator=g).to(dtype)
    x = torch.randn(5, 64, generator=g).to(dtype)
    for b in (bias, None):
        fixed = FixedLinear(weight, b)
        assert fixed.packed == packing_supported(weight)
        assert fixed.packed == (dtype != torch.float16 and packing_supported(torch.zeros(2, 2, dtype=dtype)))
        out, expected = fixed(x), F.linear(x, weight, b)
        assert out.dtype == dtype and out.shape == (5, 96)
        if dtype == torch.float32:  # oneDNN's fp32 sums where MKL's were
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        else:  # bf16: the same arithmetic packed; fp16: F.linear itself
            assert torch.equal(out, expected)
