"""Compute dtypes chosen for the device: `auto`, and the default when a dtype key is left unset (null).

`auto`: bf16 where the device multiplies it natively, fp32 elsewhere. Unset (`device_default_dtype`):
bf16 on a GPU that supports it, as verl's defaults compute there, and fp32 on a CPU, where the
defaults stay what every recipe and test was measured with (the quickstart opts in with `auto`).

A CPU with AVX512_BF16 or AMX multiplies bf16 several times faster than fp32, which makes whole steps
faster (measured: benchmarks/results/grpo_vs_trl.md, its fp32 and bf16 rows); a CPU without those
instructions emulates bf16 and is slower in it than in fp32. A GPU qualifies when torch reports bf16
support (Ampere and later). Master weights, optimizer state, gradient reduction and log-softmax stay
fp32 whatever the compute dtype (FSDP2's MixedPrecisionPolicy keeps the sharded parameters in their
loaded dtype; `logprobs_from_logits` upcasts).

CPUs with AVX2 and no AVX-512 (`torch.backends.cpu.get_cpu_capability()` says AVX2) run this project
too. There torch emulates bf16, in matmuls and decoding-sized linears alike far slower than fp32, so
`auto` picks fp32 there and a dtype key that names bf16 outright gets `emulated_bf16_warning`'s warning.
"""

from __future__ import annotations

import torch

from hybridrl.utils.device import device_type as process_device_type

AUTO = "auto"
BF16_NAMES = ("bfloat16", "bf16")  # what a dtype key may say for bf16 (hybridrl.models.loading.DTYPES)


def native_bf16(device_type: str | None = None) -> bool:
    """Whether `device_type` ("cpu" / "cuda"; default: this process's, `hybridrl.utils.device`) multiplies
    bf16 natively."""
    device_type = device_type or process_device_type()
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch's own CPUID probes
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def auto_dtype(device_type: str | None = None) -> torch.dtype:
    """bf16 where `native_bf16`, else fp32: what `dtype: auto` means on this process's device."""
    return torch.bfloat16 if native_bf16(device_type) else torch.float32


def device_default_dtype(device_type: str | None = None) -> torch.dtype:
    """What an unset (null) compute dtype means: bf16 on a bf16 GPU, fp32 on a CPU or an older GPU."""
    device_type = device_type or process_device_type()
    return torch.bfloat16 if device_type == "cuda" and native_bf16("cuda") else torch.float32


def emulated_bf16_warning(key: str, value: str | None, device_type: str) -> str | None:
    """The warning for dtype key `key` set to bf16 by name (`value`) where the device (`device_type`, as
    trainer.device resolved) emulates bf16, or None: a CPU without AVX512_BF16 or AMX runs it many times
    slower than fp32 (module doc), which a user who asked for bf16 to go faster should hear at once."""
    if value not in BF16_NAMES or device_type != "cpu" or native_bf16("cpu"):
        return None
    return (f"{key}={value} on a CPU without native bf16 (no AVX512_BF16 or AMX; torch's capability: "
            f"{torch.backends.cpu.get_cpu_capability()}): torch emulates bf16 here, many times slower than fp32. "
            f"Set {key}=auto (bf16 only where the CPU multiplies it natively) or float32")
