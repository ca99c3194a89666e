"""Shared pytest fixtures.

Offline by construction: the environment variables below are set before any test module imports
transformers or huggingface_hub (both read them at import time), so no test can reach the Hub. The
device is pinned to the CPU the same way (`hybridrl.utils.device.DEVICE_ENV`; see below).

Fixtures for model-backed tests (session-scoped: built once per test session, ~1-2 s each):

- `tiny_model_dir`: a ~1M-parameter Qwen2 model + tokenizer made by `hybridrl.models.tiny`
  (seed 0, hidden 128, 4 layers, ~512-token byte-level BPE, ChatML chat template). A `pathlib.Path`.
- `tiny_llama_dir`: the same size as a Llama model.
- `tiny_tokenizer`: the tokenizer of `tiny_model_dir`, loaded with `hybridrl.models.load_tokenizer`
  (right padding; pad id 0, bos id 1, eos `<|im_end|>` id 3). Shared across tests: do not mutate it;
  use `hybridrl.models.padding_side(tok, "left")` for a temporary left-padded call.

Treat the directories as read-only; copy one to `tmp_path` if a test must write into it.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Under pytest-xdist (`-n auto`) the workers share the cores: each worker's torch, and the processes it
# starts, take an equal share of them, and OpenMP threads sleep instead of spinning while they wait, so
# that no worker's busy-wait takes a core from another's (set before torch loads its OpenMP runtime).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _workers)))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The suite computes on the CPU on any machine: code that builds engines or workers in the test process
# (no launcher to hand it trainer.device) would otherwise take the fallback, cuda where a GPU is visible.
# Runs that name trainer.device=cuda (the tests marked `gpu`) still get it: their launchers set it.
from hybridrl.utils.device import DEVICE_ENV  # noqa: E402  (imports torch, not transformers)

os.environ.setdefault(DEVICE_ENV, "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hybridrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_1m"), arch="qwen2", size="1m", seed=0)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hybridrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama_1m"), arch="llama", size="1m", seed=0)


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The arithmetic task in verl's parquet schema: 64 train rows, 8 test rows (seed 3)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("arithmetic")
    subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(out),
                    "--train-size", "64", "--test-size", "8", "--seed", "3"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from hybridrl.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster shared by consecutive tests that use it: a start costs seconds, and run_ppo / run_sft
    join a connected driver instead of starting (and stopping) their own. Tests must leave it as they found
    it. `pytest_runtest_teardown` below shuts it down after the last of a run of such tests."""
    import ray

    from hybridrl.controller.ray import init_ray

    if not ray.is_initialized():
        init_ray(num_cpus=2)


def _shares_ray(item: pytest.Item) -> bool:
    return "ray_cluster" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut the shared Ray cluster down once the tests that use it are done (after their module fixtures'
    teardown, which runs first), so no later test runs in a driver connected to Ray."""
    if _shares_ray(item) and (nextitem is None or not _shares_ray(nextitem)):
        import ray

        ray.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests on the shared Ray cluster first and together, then those that start their own: under
    `-n auto` (with the `--dist loadfile --no-loadscope-reorder` of pyproject.toml) each module goes to one
    worker, so a module's tests share its Ray cluster, and the longest runs start first. Skip the tests
    marked `gpu` where torch sees no CUDA device."""
    items.sort(key=lambda item: (not _shares_ray(item), item.get_closest_marker("ray") is None))  # stable
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is false")
    for item in gpu_tests:
        item.add_marker(skip)
