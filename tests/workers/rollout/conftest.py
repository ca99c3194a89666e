"""Fixtures for the rollout tests: the tiny Qwen2 model in fp32, eval mode."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir: Path):
    from hybridrl.models.loading import load_causal_lm

    return load_causal_lm(tiny_model_dir, dtype="float32").eval()
