from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the fault-injection workload for longer (CHERAMI_SOAK_SECONDS, default 600)",
    )


@pytest.fixture(scope="session")
def soak_seconds(request: pytest.FixtureRequest) -> float:
    if request.config.getoption("--soak"):
        return float(os.environ.get("CHERAMI_SOAK_SECONDS", "600"))
    return 0.0
