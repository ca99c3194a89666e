"""Fixtures of the two-host tests: a Ray cluster of two hosts (network namespaces) owned by the module that uses it,
(the task data and the tiny model its runs train on are tests/conftest.py's). Where namespaces cannot be made, the tests skip saying why."""

from __future__ import annotations

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
