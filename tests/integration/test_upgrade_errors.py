"""An error after a WebSocket upgrade closes the WebSocket (1011, the error's code as
its reason): an HTTP answer written into an upgraded connection reaches the client as
garbage in its frames (issue: a frame nested 100,000 deep got an HTTP 500 that way).
The frontend's own middleware on a real listener, with a handler that fails after its
upgrade the way an unforeseen bug would."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from cherami.errors import Unavailable
from cherami.httpbase import upgrade
from cherami.roles.frontend.app import ROUTER, errors_middleware


async def _broken_after_upgrade(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse()
    await upgrade(request, ws)
    await ws.receive()  # the client's first frame, then a bug
    raise RuntimeError("a bug after the upgrade")


async def _unavailable_after_upgrade(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse()
    await upgrade(request, ws)
    await ws.receive()
    raise Unavailable("the store went away")


async def _broken_before_upgrade(request: web.Request) -> web.StreamResponse:
    raise RuntimeError("a bug before the upgrade")


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = web.Application(middlewares=[errors_middleware])
    app[ROUTER] = None
    app.router.add_get("/after", _broken_after_upgrade)
    app.router.add_get("/unavailable", _unavailable_after_upgrade)
    app.router.add_get("/before", _broken_before_upgrade)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("path", "reason"), [("/after", "internal"), ("/unavailable", "unavailable")]
)
async def test_an_error_after_the_upgrade_is_a_1011_close_not_http_bytes(
    url: str, path: str, reason: str
) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(url + path) as ws:
        await ws.send_bytes(b"\x91\xc0")
        msg = await ws.receive(timeout=10)
        # before: the 500's HTTP bytes arrived inside the WebSocket, a protocol error
        assert msg.type == aiohttp.WSMsgType.CLOSE, msg
        assert msg.data == 1011
        assert msg.extra == reason


async def test_an_error_before_the_upgrade_is_still_an_http_answer(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(url + "/before")
        assert refused.value.status == 500
