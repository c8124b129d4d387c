from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# `make test` runs `pytest -n 3` (pytest-xdist): the suite mostly waits (leases, pauses,
# timeouts; it keeps the two cores less than half busy), so three workers cut its wall
# time. The fault proofs are one unit of work, run one after another by one worker; the
# Spark tests and the checks that lean on timing under load (the netns CPU quota, extent
# scaling by rate, how a queue's publishes spread over two input hosts, the cluster's
# restarts) are another; xdist hands the units out largest first, and the third worker
# (and each of the others once done) runs every other module, a module at a time (a
# module's shared node or cluster starts once). So no two of the fault proofs, and no two
# of the timing checks, run at once.
FAULTS = ("tests/faults/",)
HEAVY = (
    "tests/spark/",
    "tests/integration/test_netns.py",
    "tests/integration/test_scaling_cluster.py",
    "tests/integration/test_publish_spread.py",
    "tests/integration/test_cluster_restart_breadth.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the fault-injection workload for longer (CHERAMI_SOAK_SECONDS, default 600)",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Units of work: the fault proofs together, the heavy tests together, every other
    module on its own (xdist's --dist loadgroup does not work with pytest 9.2: it renames
    nodes the old way)."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(FAULTS):
                return "faults"
            return "heavy" if nodeid.startswith(HEAVY) else nodeid.split("::", 1)[0]

    return Scheduler(config, log)


@pytest.fixture(scope="session")
def soak_seconds(request: pytest.FixtureRequest) -> float:
    if request.config.getoption("--soak"):
        return float(os.environ.get("CHERAMI_SOAK_SECONDS", "600"))
    return 0.0
