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
from cherami.errors import CheramiError, Unavailable
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


async def test_a_server_that_is_not_cherami_is_named_as_such() -> None:
    """A URL that points at another web server once reported ``internal: HTTP 404:
    b'<!DOCTYPE…'``, which docs/api.md calls a Cherami bug. Now the error says the URL
    may not be a Cherami server; a proxy's 502-504 is Unavailable (retried)."""
    from aiohttp import web

    async def page(request: web.Request) -> web.Response:
        if request.path.startswith("/v1/queues/busy"):
            return web.Response(status=503, text="<html>upstream down</html>")
        return web.Response(status=404, text="<!DOCTYPE html><html>Not Found</html>")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with AsyncClient(f"http://127.0.0.1:{port}", idempotent_retry_seconds=0) as c:
            with pytest.raises(CheramiError, match="may not point at a Cherami server"):
                await c.create_queue("orders")
            with pytest.raises(Unavailable, match="may not point at a Cherami server"):
                await c.get_queue("busy")
    finally:
        await runner.cleanup()


async def test_a_host_name_that_does_not_resolve_fails_at_once() -> None:
    """A wrong URL once made ``publish`` retry in silence for 30 s: a name that does
    not resolve is a mistake in the URL, not a server that is down, so it is said at once
    (the ``.invalid`` top-level domain never resolves)."""
    async with AsyncClient("http://no-such-host.invalid:8080") as c:
        async with asyncio.timeout(10):  # the publish retry window is 30 s
            with pytest.raises(CheramiError, match="cannot resolve the host"):
                await c.publish("orders", ["x"])
