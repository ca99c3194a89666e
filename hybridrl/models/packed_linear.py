"""Linear layers whose weights are reordered once for oneDNN, for CPU inference with fixed weights.

`F.linear` on a CPU hands its weight to a library at every call as it is: in bf16 to oneDNN as a plain
row-major matrix, in fp32 to MKL's sgemm. oneDNN's own blocked layout for the weight
(`torch.ops.mkldnn._reorder_linear_weight`, the op inductor's freezing pass packs weights with) can be
made once and then fed to `torch.ops.mkldnn._linear_pointwise`, the linear inductor calls on it.
In bf16 the arithmetic is the same: the outputs are equal bit for bit (tests/models/test_packed_linear.py),
and a decoding step's few rows go through faster and at a steadier speed than the plain call's. In fp32
oneDNN replaces MKL, which on the AMD CPUs this project is measured on runs well below oneDNN's rate; the
outputs are fp32 sums in another order (within 3e-4 of an fp64 product where MKL's are within 8e-5,
2048 x 2048 x 2048, entries of size ~45). Packing costs one reorder per weight and generation, which the
many decoding steps that reuse it repay; whole generations sample the same tokens, with the same log-probs
in bf16 and log-probs within fp32 rounding in fp32 (measured: benchmarks/results/packed_linear.md).

The same packing inside a training step (forward packed per call, backward as torch's) gained nothing
measurable, so training and log-prob passes keep `F.linear`
(measured: benchmarks/README.md, "Packed oneDNN linears (`packed_linear.py`)"). Only on x86-64, the only
CPUs it was measured on; not measured on an Intel CPU, where MKL is at home.

Only for weights that stay fixed while the block runs: a generation's, after the engine has gathered
and cast them. A call that needs gradients, or whose weight is no longer the one packed (replaced or
modified in place), runs `F.linear` as usual instead of a stale pack.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from hybridrl.models.onednn_linear import is_plain_linear


def packing_supported(weight: torch.Tensor) -> bool:
    """Whether `weight` can run packed: a plain 2-D bf16 or fp32 tensor on an x86-64 CPU, with oneDNN (and
    its bf16 kernels, for bf16) in this torch build."""
    ops = torch.ops.mkldnn
    return (
        type(weight.data) is torch.Tensor  # not a DTensor or another subclass
        and weight.dim() == 2
        and weight.device.type == "cpu"
        and weight.dtype in (torch.bfloat16, torch.float32)
        and platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
        and (weight.dtype != torch.bfloat16 or ops._is_mkldnn_bf16_supported())
    )


class FixedLinear:
    """`x @ weight.T + bias` for a weight that stays fixed while this object lives: over a oneDNN pack of
    the weight where `packing_supported`, through `F.linear` elsewhere. For weights nobody else holds (a
    stack of several layers' weights, say); a layer's own weight packs with `prepacked_linears`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.bias = bias
        self.packed = packing_supported(weight)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight) if self.packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class _PackedForward:
    """A `nn.Linear`'s forward over the pack of its weight as it was when packed."""

    def __init__(self, linear: nn.Linear) -> None:
        self.linear = linear
        weight = linear.weight.detach()
        self.source = (weight.data_ptr(), weight._version)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.linear.weight, self.linear.bias
        stale = (weight.data_ptr(), weight._version) != self.source
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad))
        if stale or needs_grad or x.dtype != weight.dtype or x.device.type != "cpu":
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


@contextlib.contextmanager
def prepacked_linears(module: nn.Module) -> Iterator[int]:
    """Within the block, every plain `nn.Linear` of `module` (`is_plain_linear`: nn.Linear's own forward or
    `OneDNNLinear`'s) with a packable weight (`packing_supported`) runs on a pack of that weight; yields how
    many do. On exit they are as before.

    The pack is a copy: the block holds one more copy of those weights. A module whose forward was
    replaced on the instance by someone else is left alone.
    """
    patched: list[nn.Linear] = []
    try:
        for sub in module.modules():
            if is_plain_linear(sub) and "forward" not in sub.__dict__ and packing_supported(sub.weight):
                sub.forward = _PackedForward(sub)
                patched.append(sub)
        yield len(patched)
    finally:
        for sub in patched:
            del sub.forward
