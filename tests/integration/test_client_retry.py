"""An idempotent call (GET, PUT, DELETE) that cannot connect is sent again with backoff,
so a client started before its node (or across a restart) gets its answer; a
non-idempotent one (receive, publish over HTTP) fails at once. Real node process."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import Unavailable
from tests.support.blackhole import free_port


async def test_idempotent_calls_wait_for_the_node(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with AsyncClient(url, idempotent_retry_seconds=0) as once:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            await once.list_queues()  # nobody listens: no retry asked for
        assert time.monotonic() - started < 1.0
    async with AsyncClient(url, idempotent_retry_seconds=60) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable):  # receive is not idempotent: never resent
            await client.receive("q", "g")
        assert time.monotonic() - started < 1.0
        node = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cherami.cli.main", "serve", "--data-dir", str(tmp_path),
            "--port", str(port), "--stores", "1",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            # sent while the node is still starting: connection refused, then again
            created, listed = await asyncio.gather(
                client.create_queue("orders"), client.list_queues()
            )
            assert created["name"] == "orders"
            assert isinstance(listed, list)
            assert [q["name"] for q in await client.list_queues()] == ["orders"]
        finally:
            node.terminate()
            assert await asyncio.wait_for(node.wait(), 30) == 0
