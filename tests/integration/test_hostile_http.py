"""Hostile HTTP on a real node (issue 34): slowloris connections that send half a
request head, or a head and a body that never ends, are closed after the node's
``http.header_timeout`` / ``http.body_timeout``; bytes that are not HTTP are one INFO
line each, not an aiohttp traceback; WebSocket streams are capped per API key and per
node (429 ``too_many_streams`` at the upgrade). The node runs with short timeouts and
small caps so each check takes a few seconds; every wait is on a condition with a
deadline."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import aiohttp
import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import TooManyStreams
from cherami.wire import stream as f
from tests.support.server import ServerProcess, unique

ADMIN, ALICE, BOB = "hostile-admin", "hostile-alice", "hostile-bob"
HEADER_TIMEOUT, BODY_TIMEOUT = 1.0, 2.0
MAX_STREAMS, MAX_STREAMS_PER_KEY = 3, 2
SLACK = 5.0  # how long past a timeout a close may come on a loaded machine


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("hostile")
    keys = root / "keys.json"
    keys.write_text(json.dumps([
        {"key": ADMIN, "scopes": ["admin"]},
        {"key": ALICE, "scopes": ["produce", "consume"]},
        {"key": BOB, "scopes": ["produce", "consume"]},
    ]))  # fmt: skip
    config = root / "cherami.json"
    config.write_text(json.dumps({"http": {
        "header_timeout": HEADER_TIMEOUT, "body_timeout": BODY_TIMEOUT,
        "max_streams": MAX_STREAMS, "max_streams_per_key": MAX_STREAMS_PER_KEY,
    }}))  # fmt: skip
    proc = ServerProcess(
        root / "node", stores=1, extra=["--auth-file", str(keys), "--config", str(config)]
    ).start()
    yield proc
    assert proc.stop() == 0, "\n".join(proc.output)


def _address(node: ServerProcess) -> tuple[str, int]:
    host, port = node.url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(node: ServerProcess, first: bytes) -> socket.socket:
    sock = socket.create_connection(_address(node), timeout=10)
    sock.sendall(first)
    return sock


def _until_closed(sock: socket.socket, deadline: float) -> bytes:
    """What the server sent until it closed the connection; fails at ``deadline``."""
    got = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"the server still holds the connection (it sent {got[:80]!r})")
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def _wait_for(condition: object, deadline: float, what: str) -> None:
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _lines(node: ServerProcess, text: str) -> list[str]:
    return [line for line in list(node.output) if text in line]


def _admin(node: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {ADMIN}"})


def test_half_a_request_head_is_closed_after_the_header_timeout(node: ServerProcess) -> None:
    q = unique()
    with _admin(node) as http:
        assert http.put(f"/v1/queues/{q}").status_code == 201
    started = time.monotonic()
    slow = [_connect(node, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(200)]
    idle = _connect(node, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # then sends nothing
    with _admin(node) as http:  # the node goes on answering meanwhile
        assert http.get("/healthz").status_code == 200
    deadline = started + HEADER_TIMEOUT + SLACK
    for sock in slow:
        assert _until_closed(sock, deadline) == b""  # closed without an answer
        sock.close()
    assert time.monotonic() - started >= HEADER_TIMEOUT * 0.9  # not at once
    answered = _until_closed(idle, deadline)  # answered, then closed once idle
    assert answered.startswith(b"HTTP/1.1 200"), answered[:80]
    idle.close()


def test_a_body_that_stalls_is_closed_after_the_body_timeout(node: ServerProcess) -> None:
    q = unique()
    with _admin(node) as http:
        assert http.put(f"/v1/queues/{q}").status_code == 201
    before = len(_lines(node, "did not arrive within"))
    head = (
        f"POST /v1/queues/{q}/messages HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode()
    started = time.monotonic()
    sock = _connect(node, head + b'{"messages": [')  # and the rest never comes
    assert _until_closed(sock, started + BODY_TIMEOUT + SLACK) == b""
    sock.close()
    # the head was in at once: the header timeout (shorter) did not apply to the body
    assert time.monotonic() - started >= BODY_TIMEOUT * 0.9
    deadline = time.monotonic() + SLACK
    _wait_for(lambda: len(_lines(node, "did not arrive within")) > before, deadline, "the log")
    (line,) = _lines(node, "did not arrive within")[before:]
    assert "INFO" in line and f"/v1/queues/{q}/messages" in line, line
    with _admin(node) as http:
        assert http.get(f"/v1/queues/{q}").json()["stats"]["messages_published"] == 0


PROBES = [
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(32)),  # TLS to plain HTTP
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n",  # a bad header value
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a request line too long
    b"\x00\xff\xfe garbage\r\n\r\n",
]


def test_malformed_http_is_one_info_line_without_a_traceback(node: ServerProcess) -> None:
    before = len(_lines(node, "malformed request from"))
    for probe in PROBES:
        sock = _connect(node, probe)
        answer = _until_closed(sock, time.monotonic() + SLACK)
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer[:13], answer[:80]
        sock.close()
    # a sentinel after them: a client that drops mid-body logs one line of its own
    q = unique()
    with _admin(node) as http:
        assert http.put(f"/v1/queues/{q}").status_code == 201
    gone = _connect(node, (
        f"POST /v1/queues/{q}/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}"
        "\r\nContent-Length: 100\r\n\r\n{"
    ).encode())  # fmt: skip
    gone.close()
    _wait_for(lambda: _lines(node, f"/v1/queues/{q}/messages: the client went away"),
              time.monotonic() + SLACK, "the sentinel's line")  # fmt: skip
    lines = _lines(node, "malformed request from")[before:]
    assert len(lines) == len(PROBES), lines
    assert all(" INFO " in line and "127.0.0.1" in line for line in lines), lines
    output = "\n".join(node.output)
    assert "Traceback" not in output and "Error handling request" not in output


async def _stream(node: ServerProcess, key: str, path: str) -> aiohttp.ClientWebSocketResponse:
    session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"})
    try:
        ws = await session.ws_connect(node.url.replace("http", "ws", 1) + path)
    except BaseException:
        await session.close()
        raise
    ws._test_session = session  # type: ignore[attr-defined]
    return ws


async def _close(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.close()
    await ws._test_session.close()  # type: ignore[attr-defined]


def _refusal(node: ServerProcess, key: str, path: str) -> httpx.Response:
    """The answer to an upgrade request (as a WebSocket client sends it)."""
    headers = {
        "Authorization": f"Bearer {key}", "Connection": "Upgrade", "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }  # fmt: skip
    with httpx.Client(base_url=node.url) as http:
        return http.get(path, headers=headers)


async def test_streams_are_capped_per_key_and_per_node(node: ServerProcess) -> None:
    q = unique()
    with _admin(node) as http:
        assert http.put(f"/v1/queues/{q}").status_code == 201
        assert http.put(f"/v1/queues/{q}/groups/g").status_code == 201
    publish, consume = f"/v1/queues/{q}/publish", f"/v1/queues/{q}/groups/g/consume"
    alice = [await _stream(node, ALICE, publish), await _stream(node, ALICE, consume)]
    bob = [await _stream(node, BOB, publish)]
    try:
        # Alice holds her max_streams_per_key (2)
        refused = _refusal(node, ALICE, publish)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_streams"
        assert "max_streams_per_key" in refused.json()["error"]["message"]
        assert refused.headers["Retry-After"] == "1"
        # the node holds its max_streams (3): Bob, under his own cap, is refused too
        refused = _refusal(node, BOB, consume)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_streams"
        assert "max_streams;" in refused.json()["error"]["message"]
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await _stream(node, BOB, consume)
        assert err.value.status == 429
        # the Python client names the refusal (it was `internal: HTTP 429`)
        async with AsyncClient(node.url, api_key=ALICE) as client:
            with pytest.raises(TooManyStreams) as too_many:
                async with client.publisher(q):
                    pass
            assert too_many.value.code == "too_many_streams" and too_many.value.status == 429
        # a refused upgrade is an HTTP answer: the open streams go on working
        await bob[0].send_bytes(f.encode(f.Publish(1, [f.OutMessage(b"still here")])))
        reply = f.decode_server((await bob[0].receive(timeout=10)).data)
        assert isinstance(reply, f.Published) and len(reply.ids) == 1
        # one of Alice's closes: its slot is free again (once the server has let it go)
        await _close(alice.pop())
        deadline = time.monotonic() + SLACK
        while True:
            try:
                alice.append(await _stream(node, ALICE, consume))
                break
            except aiohttp.WSServerHandshakeError as refused_again:
                assert refused_again.status == 429
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)
    finally:
        for ws in alice + bob:
            await _close(ws)
