"""Model FLOPs, MFU and the peak probe against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hybridrl.utils import metric as flops
from hybridrl.utils.device import DEVICE_ENV
from hybridrl.utils.metric import (
    FORWARD_FLOPS_PER_PARAM,
    TRAIN_FLOPS_PER_PARAM,
    ModelPass,
    combine_ranks,
    datasheet_peak_flops,
    matmul_params,
    matmul_peak_flops,
    mfu,
    model_flops,
)


def test_kaplan_flops_and_mfu_by_hand():
    # 1M parameters, 1,000 real tokens: forward 2 x 1e6 x 1e3 = 2e9; an update over 2 epochs 6 x ... x 2 = 1.2e10
    assert model_flops(1_000_000, 1_000, FORWARD_FLOPS_PER_PARAM) == 2e9
    assert model_flops(1_000_000, 1_000, TRAIN_FLOPS_PER_PARAM, passes=2) == 1.2e10
    # 1.2e10 FLOPs in 0.5 s on two ranks of 30 GFLOP/s each: 1.2e10 / (0.5 x 6e10) = 0.4
    assert mfu(1.2e10, 0.5, 6e10) == pytest.approx(0.4)
    assert ModelPass(1_000_000, 6, 2, 6e10).flops(1_000) == 1.2e10
    with pytest.raises(ValueError, match="positive"):
        mfu(1.0, 0.0, 1.0)


class TinyLM(nn.Module):
    """Embedding 10 x 4 (40), one 4 x 4 layer with bias (20), head 4 -> 10 without bias (40)."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layer = nn.Linear(4, 4)
        self.head = nn.Linear(4, 10, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head


def test_matmul_params_leave_out_an_untied_input_embedding():
    # untied: 40 + 20 + 40 = 100 stored, of which the 40-entry lookup table does no arithmetic -> 60
    assert matmul_params(TinyLM(tied=False)) == 60
    # tied: the head is the embedding, stored and counted once: 40 + 20 = 60, all of which multiply
    assert matmul_params(TinyLM(tied=True)) == 60
    # a module without embeddings: every parameter (4 x 4 + 4 = 20)
    assert matmul_params(nn.Linear(4, 4)) == 20


def test_the_tiny_model_counts_its_stored_parameters(tiny_model_dir):
    from safetensors import safe_open

    from hybridrl.models.loading import load_causal_lm

    with safe_open(f"{tiny_model_dir}/model.safetensors", framework="pt") as f:
        stored = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118
    # tied embeddings: what the checkpoint stores is exactly what multiplies
    assert matmul_params(load_causal_lm(tiny_model_dir)) == stored


def test_ranks_combine_into_one_pass_with_the_summed_peak():
    rank0 = {"actor": ModelPass(100, 6, 1, 2.0), "actor_infer": ModelPass(100, 2, 1, 2.0)}
    rank1 = {"actor": ModelPass(100, 6, 1, 3.0), "actor_infer": ModelPass(100, 2, 1, 3.0)}
    assert combine_ranks([rank0, rank1]) == {"actor": ModelPass(100, 6, 1, 5.0),
                                             "actor_infer": ModelPass(100, 2, 1, 5.0)}
    with pytest.raises(ValueError, match="'actor'"):
        combine_ranks([rank0, {"actor": ModelPass(99, 6, 1, 3.0)}])


def test_matmul_probe_measures_a_plausible_peak_without_touching_the_global_rng():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    peak = matmul_peak_flops(torch.float32, max_size=256, repeats=2)
    # any CPU of the last decade does more than 100 MFLOP/s and less than 100 TFLOP/s in fp32
    assert 1e8 < peak < 1e14
    assert torch.equal(torch.rand(3), expected_next)


def test_matmul_probe_grows_only_while_a_matmul_is_quick(monkeypatch):
    sides = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: sides.append(a.shape[0]) or real(a, b))
    matmul_peak_flops(torch.float32, max_size=1024, repeats=2, target_s=0.0)  # every matmul counts as slow
    assert set(sides) == {256}
    sides.clear()
    matmul_peak_flops(torch.float32, max_size=1024, repeats=2, target_s=float("inf"))
    assert sides[-2:] == [1024, 1024] and max(sides) == 1024


def test_datasheet_peaks_and_the_per_process_cache(monkeypatch):
    assert datasheet_peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert datasheet_peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert datasheet_peak_flops("Some Other GPU", torch.bfloat16) is None

    calls = []
    monkeypatch.setattr(flops, "matmul_peak_flops", lambda dtype, device: calls.append(dtype) or 1e9)
    monkeypatch.setenv(DEVICE_ENV, "cpu")  # the CPU probe path, on any machine
    flops._cached_peak.cache_clear()
    try:
        assert flops.device_peak_flops(torch.float32) == 1e9
        assert flops.device_peak_flops(torch.float32) == 1e9  # measured once per dtype and thread count
        assert calls == [torch.float32]
    finally:
        flops._cached_peak.cache_clear()
