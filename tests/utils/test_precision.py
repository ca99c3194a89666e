"""Compute dtypes: `auto` (the one automatic value) is bf16 on a bf16 GPU and fp32 on a CPU; a CPU's native bf16
is found exactly where the kernel reports the instructions."""

import os
from pathlib import Path

import pytest
import torch

from hybridrl.models.loading import resolve_dtype
from hybridrl.utils.device import DEVICE_ENV, auto_dtype, native_bf16


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


def cpu_multiplies_bf16() -> bool:
    """The kernel's own CPUID report, independent of torch's probe, unless the environment holds torch to kernels
    below AVX-512 (ATEN_CPU_CAPABILITY), where bf16 is emulated whatever the CPU has."""
    held_below = os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("default", "avx2")
    return not held_below and bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def test_native_bf16_is_found_exactly_where_the_cpu_multiplies_bf16_natively():
    assert native_bf16("cpu") is cpu_multiplies_bf16()


def test_named_dtypes_resolve_as_before():
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("float32") is torch.float32
    with pytest.raises(KeyError, match="fp8"):
        resolve_dtype("fp8")


def test_half_precision_on_a_cpu_runs_eager_attention_and_everything_else_sdpa():
    from hybridrl.models.attention import default_attention

    assert default_attention(torch.bfloat16, "cpu") == default_attention(torch.float16, "cpu") == "grouped_eager"
    assert default_attention(torch.float32, "cpu") == "sdpa"
    assert default_attention(torch.bfloat16, "cuda") == default_attention(torch.float32, "cuda") == "sdpa"


@pytest.mark.parametrize("device, bf16_gpu, expected", [
    ("cpu", True, torch.float32),  # fp32 on any CPU, native bf16 or not (a recipe names bfloat16 to opt in)
    ("cuda", True, torch.bfloat16),  # verl's default compute dtype on a GPU
    ("cuda", False, torch.float32),  # a GPU without bf16 (pre-Ampere)
])
def test_auto_is_the_devices_compute_dtype(monkeypatch, device, bf16_gpu, expected):
    monkeypatch.setenv(DEVICE_ENV, device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16_gpu)
    assert resolve_dtype("auto") is auto_dtype() is expected
    with pytest.raises(ValueError, match="the automatic value is 'auto'"):
        resolve_dtype(None)


def test_bf16_named_on_a_cpu_that_emulates_it_gets_a_warning_naming_the_key():
    from hybridrl.utils.device import emulated_bf16_warning

    native = cpu_multiplies_bf16()
    key = "actor_rollout_ref.rollout.dtype"
    for name in ("bfloat16", "bf16"):
        warning = emulated_bf16_warning(key, name, "cpu")
        assert (warning is None) is native
        if not native:
            assert warning.startswith(f"{key}={name} on a CPU without native bf16") and f"{key}=float32" in warning
    # never for the other values, nor on a GPU (torch.cuda reports its own bf16 support)
    for name in ("auto", "float32"):
        assert emulated_bf16_warning(key, name, "cpu") is None
    assert emulated_bf16_warning(key, "bf16", "cuda") is None
