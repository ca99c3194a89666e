"""Fixtures for the controller tests."""

import os

import pytest
import torch.distributed as dist

DIST_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def local_env():
    saved = {k: os.environ.get(k) for k in DIST_KEYS}
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
