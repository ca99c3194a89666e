"""Linear layers that multiply through oneDNN on an x86 CPU: `OneDNNLinear` (fp32 training and log-prob
passes, equal to `F.linear` up to fp32 rounding) and `prepacked_linears` (generation, bf16 bit for bit).
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


def onednn_fp32_supported() -> bool:
    """Whether fp32 linears can run through oneDNN here: an x86-64 CPU and a torch build with oneDNN."""
    return (
        platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., in) @ weight.T + bias through oneDNN, (..., out), owning its memory: FSDP2 warns about a view."""
    out2d = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]).contiguous(), weight, bias, "none", [], "")
    return out2d.new_empty(0).set_(out2d.untyped_storage(), out2d.storage_offset(), (*x.shape[:-1], weight.shape[0]))


def _needs_grad(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))


class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x @ W.T + b, with the forward and the input gradient through oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad2d = grad_out.reshape(-1, grad_out.shape[-1])  # (rows, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_linear(grad_out, weight.t().contiguous(), None)  # g @ W: a linear with weight W.T
        if ctx.needs_input_grad[1]:
            grad_w = grad2d.t() @ x.reshape(-1, x.shape[-1])  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad2d.sum(0)
        return grad_x, grad_w, grad_b


class OneDNNLinear(nn.Linear):
    """An `nn.Linear` computing through oneDNN for fp32 CPU tensors, `F.linear` otherwise."""

    # a subclass whose forward is x @ W.T + b and nothing more: the decoding paths may treat it as nn.Linear
    computes_plain_linear = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if (x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
                or weight.device.type != "cpu" or type(weight.data) is not torch.Tensor or x.numel() == 0
                or (bias is not None and bias.dtype != torch.float32)
                or torch.is_autocast_enabled("cpu")):
            return F.linear(x, weight, bias)
        if _needs_grad(x, weight, bias):
            return _OneDNNLinearFunction.apply(x, weight, bias)
        return _onednn_linear(x, weight, bias)


def use_onednn_linears(module: nn.Module) -> int:
    """Make every linear of class exactly `nn.Linear` in `module` a `OneDNNLinear` where supported; returns how many."""
    if not onednn_fp32_supported():
        return 0
    linears = [sub for sub in module.modules() if type(sub) is nn.Linear]
    for sub in linears:
        sub.__class__ = OneDNNLinear
    return len(linears)


def is_plain_linear(module: object) -> bool:
    """An `nn.Linear` whose forward is exactly x @ W.T + b: nn.Linear itself, or a subclass that says so."""
    return type(module) is nn.Linear or bool(getattr(type(module), "computes_plain_linear", False))


def packing_supported(weight: torch.Tensor) -> bool:
    """Whether `weight` can run packed: a plain 2-D bf16 or fp32 CPU tensor on x86-64, with oneDNN."""
    ops = torch.ops.mkldnn
    return (
        type(weight.data) is torch.Tensor  # not a DTensor or another subclass
        and weight.dim() == 2
        and weight.device.type == "cpu"
        and weight.dtype in (torch.bfloat16, torch.float32)
        and onednn_fp32_supported()
        and hasattr(ops, "_reorder_linear_weight")
        and (weight.dtype != torch.bfloat16 or ops._is_mkldnn_bf16_supported())
    )


class FixedLinear:
    """`x @ weight.T + bias` for a weight fixed while this object lives, over a oneDNN pack where supported."""

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
        if stale or _needs_grad(x, weight, bias) or x.dtype != weight.dtype or x.device.type != "cpu":
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


@contextlib.contextmanager
def prepacked_linears(module: nn.Module) -> Iterator[int]:
    """Within the block, every plain linear of `module` with a packable weight runs on a pack (a copy) of it,
    falling back to `F.linear` where gradients are needed or the weight changed; yields how many."""
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
