from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import ServerProcess


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "node")
    yield proc
    proc.stop()
