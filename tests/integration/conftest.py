from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One node for the tests that only need a server; each test uses its own queues."""
    proc = ServerProcess(tmp_path_factory.mktemp("node")).start()
    yield proc
    code = proc.stop()
    assert code == 0, "the node did not stop cleanly:\n" + "\n".join(proc.output)


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A node of its own, for tests that kill or restart it."""
    proc = ServerProcess(tmp_path / "node")
    yield proc
    proc.stop()


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url) as c:
        yield c
