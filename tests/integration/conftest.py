from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from tests.support.inprocess import InProcessNode
from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessNode]:
    """A module's node for the tests of the roles' logic; each test uses its own queues.
    In this process, its store hosts the in-process double (tests/support/inprocess.py):
    the tests that kill, restart or fill a node use processes (``fresh_server``). One a
    module (it starts in about a second), not one a session: a module that forks
    children with a preexec_fn (test_first_hour) runs without a node's thread beside it."""
    node = InProcessNode(tmp_path_factory.mktemp("node")).start()
    yield node
    node.stop()


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A node of its own, for tests that kill or restart it."""
    proc = ServerProcess(tmp_path / "node")
    yield proc
    proc.stop()


@pytest.fixture
async def client(server: InProcessNode) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url) as c:
        yield c
