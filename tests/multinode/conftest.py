"""Fixtures of the two-host tests: a Ray cluster of two hosts (network namespaces) owned by the module that uses it,
and the task data and tiny model its runs train on. Where namespaces cannot be made, the tests skip saying why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from two_host_cluster import TwoHostCluster, namespaces_unavailable


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory):
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = TwoHostCluster(tmp_path_factory.mktemp("two_hosts"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
    left = cluster.leftovers()
    assert not left, f"the two-host cluster left {left} behind"


@pytest.fixture(scope="session")
def multinode_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("multinode_arithmetic")
    subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(out),
                    "--train-size", "64", "--test-size", "8", "--seed", "3"], check=True, capture_output=True)
    return out
