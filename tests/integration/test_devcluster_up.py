"""LocalCluster.up that fails (a process that does not come up) stops the processes it
started: a CI run left a store host running after its sibling exited at start. Real
role processes, whose metadata (a PostgreSQL port nothing listens on) never answers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cherami.devcluster.local import LocalCluster
from cherami.errors import Unavailable


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_cluster_that_does_not_come_up_leaves_nothing_running(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, "postgresql://postgres@127.0.0.1:1/test", {"storehost": 2})
    with pytest.raises(Unavailable):
        cluster.up(timeout=3.0)  # they wait for their metadata: none listens
    pids = [proc.pid for proc in cluster.procs.values()]
    assert pids and all(pids)  # both were started
    assert not [pid for pid in pids if _running(pid)]
