"""fp32 linear layers that multiply through oneDNN on an x86 CPU, in training passes and passes without
gradients alike.

torch hands an fp32 `F.linear` on a CPU to MKL's sgemm, which on the AMD CPUs this project is measured on
runs well below what oneDNN reaches on the same matrices (oneDNN is what bf16 calls already take).
`OneDNNLinear` is an `nn.Linear` whose forward computes `x @ W.T + b` with oneDNN's
`torch.ops.mkldnn._linear_pointwise` (the plain weight, no pack: the weight changes every optimizer step),
and whose backward takes the input gradient `g @ W` through oneDNN too (on a transposed copy of W, a
weight-sized copy against a matrix product over every row) and the weight gradient `g.T @ x` through
torch's own path (oneDNN would need both operands transposed first, which measured no faster).
The forward and the input gradient, two of a training linear's three products, then run at oneDNN's
rate, which makes whole fp32 training steps faster (measured: benchmarks/results/grpo_vs_trl_fp32_onednn.md).

The sums are fp32 sums in oneDNN's order instead of MKL's: outputs and gradients agree with `F.linear`'s
to fp32 rounding, not bit for bit (tests/models/test_onednn_linear.py). Every other call (another
dtype, a GPU tensor, autocast, no rows) is `F.linear` itself, so bf16 compute and the GPU are unchanged.
Not measured on an Intel CPU, where MKL is at home.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import nn


def onednn_fp32_supported() -> bool:
    """Whether this process can run fp32 linears through oneDNN: an x86-64 CPU and a torch build with
    oneDNN enabled and its linear op."""
    return (
        platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _onednn_linear(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """(rows, in) @ (out, in).T + bias through oneDNN, returned in `shape` (rows unflattened, then out).

    The result owns its memory instead of being a view of the op's (rows, out) output, which nothing else
    holds: FSDP2 warns about a wrapped module that returns a view (an LM head's logits), since an in-place op
    on a view would bypass its backward hook."""
    out2d = torch.ops.mkldnn._linear_pointwise(x2d, weight, bias, "none", [], "")
    return out2d.new_empty(0).set_(out2d.untyped_storage(), out2d.storage_offset(), shape)


class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x @ W.T + b, with the forward and the input gradient through oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        ctx.save_for_backward(x2d, weight)
        ctx.input_shape = x.shape
        ctx.has_bias = bias is not None
        return _onednn_linear(x2d, weight, bias, (*x.shape[:-1], weight.shape[0]))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2d, weight = ctx.saved_tensors
        grad2d = grad_out.reshape(-1, grad_out.shape[-1]).contiguous()  # (rows, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # g @ W is a linear with weight W.T: (rows, out) x (in, out).T
            grad_x = _onednn_linear(grad2d, weight.t().contiguous(), None, ctx.input_shape)
        if ctx.needs_input_grad[1]:
            grad_w = grad2d.t() @ x2d  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad2d.sum(0)
        return grad_x, grad_w, grad_b


class OneDNNLinear(nn.Linear):
    """An `nn.Linear` computing through oneDNN where its input and weight are fp32 CPU tensors (the module
    docstring says why); `F.linear` for everything else. Same parameters, state dict and outputs up to
    fp32 rounding."""

    # a subclass whose forward is x @ W.T + b and nothing more: the decoding paths may treat it as nn.Linear
    computes_plain_linear = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if (x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
                or weight.device.type != "cpu" or type(weight.data) is not torch.Tensor or x.numel() == 0
                or (bias is not None and bias.dtype != torch.float32)
                or torch.is_autocast_enabled("cpu")):
            return F.linear(x, weight, bias)
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad))
        if needs_grad:
            return _OneDNNLinearFunction.apply(x, weight, bias)
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        return _onednn_linear(x2d, weight, bias, (*x.shape[:-1], weight.shape[0]))


def use_onednn_linears(module: nn.Module) -> int:
    """Turn every plain `nn.Linear` of `module` (its class exactly nn.Linear) into a `OneDNNLinear`, in place,
    where `onednn_fp32_supported()`; returns how many. Parameters, hooks and state dict stay as they are."""
    if not onednn_fp32_supported():
        return 0
    count = 0
    for sub in module.modules():
        if type(sub) is nn.Linear:
            sub.__class__ = OneDNNLinear
            count += 1
    return count


def is_plain_linear(module: object) -> bool:
    """An `nn.Linear` whose forward is exactly x @ W.T + b: nn.Linear itself, or a subclass that says so."""
    return type(module) is nn.Linear or bool(getattr(type(module), "computes_plain_linear", False))
