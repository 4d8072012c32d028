"""Fixtures of the multi-node tests: one emulated cluster per test module, skipped with the reason without root.

A module says what cluster it needs with a module-level ``CLUSTER`` dict of
:class:`~enkflow_testing.cluster.Cluster` keywords (default: 2 nodes, no
SLURM); the experiment root ``cluster_shared`` (under pytest's ``/tmp``) is
the same folder on every node. After the module, nothing of the cluster may
be left on the machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from enkflow_testing.cluster import Cluster
from enkflow_testing.cluster_ns import ClusterUnavailable, missing_reason


@pytest.fixture(scope="module")
def cluster_shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The experiment root every node sees (bound through each node's private /tmp)."""
    return tmp_path_factory.mktemp("cluster-shared")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, cluster_shared: Path) -> Iterator[Cluster]:
    """The module's emulated cluster (its ``CLUSTER`` keywords), started once, removed after the module."""
    reason = missing_reason()
    if reason:
        pytest.skip(f"emulated cluster unavailable: {reason}")
    kw = {"n_nodes": 2, **getattr(request.module, "CLUSTER", {})}
    c = Cluster(shared=[cluster_shared, *kw.pop("shared", [])], **kw)
    try:
        c.start()
    except ClusterUnavailable as exc:  # cannot run here; a harness that fails to start (ClusterFailed) fails
        pytest.skip(str(exc))
    print(f"cluster start-up (s): {c.startup_s}")
    yield c
    c.stop()
    assert not c.leftovers(), f"the cluster left {c.leftovers()}"
