"""Read grants (issue 33, part 3; wire/grants.py): a node with API keys issues them to a
key that may consume the queue (403 otherwise), for that queue's extents only; a store
host serves a grant connection reads of the granted extents until the grant expires and
refuses everything else (append, seal, drop, create, info, another extent) with a
``Failed`` it can read; a forged grant gets no byte."""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from cherami.wire import grants
from cherami.wire import handshake as h
from cherami.wire import store as w
from cherami.wire.framing import pack_frame
from cherami.wire.store import PLAIN
from tests.support.server import ServerProcess, keyed_node

READER, WRITER, OTHER = "reader-key", "writer-key", "other-reader-key"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = keyed_node(tmp_path_factory.mktemp("grants"), [
        {"key": "admin-key", "scopes": ["admin"]},
        {"key": READER, "scopes": ["consume"], "prefixes": ["orders"]},
        {"key": WRITER, "scopes": ["produce"], "prefixes": ["orders"]},
        {"key": OTHER, "scopes": ["consume"], "prefixes": ["billing"]},
    ], stores=1)  # fmt: skip
    with httpx.Client(base_url=proc.url, headers=_h("admin-key")) as http:
        for queue in ("orders", "orders-b"):
            assert http.put(f"/v1/queues/{queue}").status_code == 201
        msgs = {"messages": [{"body": f"m{i}"} for i in range(5)]}
        assert http.post("/v1/queues/orders/messages", json=msgs).status_code == 200
        assert http.post("/v1/queues/orders-b/messages", json=msgs).status_code == 200
    yield proc
    proc.stop()


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _plain_extent(node: ServerProcess, queue: str) -> tuple[str, str]:
    """The queue's plain extent and the address of its replica."""
    reply = httpx.get(f"{node.url}/v1/queues/{queue}/extents", headers=_h("admin-key")).json()
    (extent,) = [e for e in reply["extents"] if e["kind"] == PLAIN]
    return extent["id"], extent["stores"][0]


def _grant(node: ServerProcess, queue: str, body: dict[str, Any]) -> grants.ReadGrant:
    reply = httpx.post(f"{node.url}/v1/queues/{queue}/read-grants", json=body, headers=_h(READER))
    assert reply.status_code == 200, reply.text
    (one,) = reply.json()["grants"]
    token, key = base64.b64decode(one["token"]), base64.b64decode(one["key"])
    return grants.ReadGrant(token, key, 0, 0)


class _Conn:
    """A raw store connection opened with a grant hello, as docs/protocol.md §7 says."""

    def __init__(self, address: str, grant: grants.ReadGrant) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        hello, nonce = grants.hello(grant)
        self.sock.sendall(hello)
        self.welcomed = h.welcome_ok(grant.key, nonce, self._exactly(h.WELCOME_SIZE))

    def _exactly(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            chunk = self.sock.recv(n - len(got))
            if not chunk:
                break
            got += chunk
        return got

    def ask(self, request: w.Request) -> w.Reply:
        self.sock.sendall(pack_frame(w.encode(request)))
        size = int.from_bytes(self._exactly(4))
        return w.decode_reply(self._exactly(size))

    def close(self) -> None:
        self.sock.close()


def _refused(reply: w.Reply, code: str) -> str:
    assert isinstance(reply, w.Failed) and reply.code == code, reply
    return reply.message


def test_only_a_key_that_may_consume_the_queue_gets_a_grant(node: ServerProcess) -> None:
    with httpx.Client(base_url=node.url) as http:
        path = "/v1/queues/orders/read-grants"
        assert http.post(path, json={}).json()["error"]["code"] == "unauthorized"
        for key in (WRITER, OTHER):  # produce scope only; consume, but not this queue
            denied = http.post(path, json={}, headers=_h(key))
            assert denied.status_code == 403, key
            assert denied.json()["error"]["code"] == "forbidden"
        ok = http.post(path, json={}, headers=_h(READER)).json()
        assert ok["lifetime_seconds"] == 600 and ok["queue"] == "orders"
        # every extent of the queue now: its plain one (a timer extent opens at the
        # first delayed message)
        assert len(ok["grants"]) == 1
        # another queue's extent is not granted on this queue
        other, _ = _plain_extent(node, "orders-b")
        wrong = http.post(path, json={"extents": [other]}, headers=_h(READER))
        assert wrong.status_code == 400 and other in wrong.json()["error"]["message"]
        for body in ({"lifetime_seconds": 0}, {"lifetime_seconds": 7200}, {"extent": "x"}):
            bad = http.post(path, json=body, headers=_h(READER))
            assert bad.status_code == 400, body


def test_a_grant_reads_its_extent_and_nothing_else(node: ServerProcess) -> None:
    extent, address = _plain_extent(node, "orders")
    other, _ = _plain_extent(node, "orders-b")
    conn = _Conn(address, _grant(node, "orders", {"extents": [extent]}))
    try:
        assert conn.welcomed
        read = conn.ask(w.Read(1, extent, b"", 100))
        assert isinstance(read, w.ReadResult) and len(read.keys) == 5
        records = w.pack_records([b"forged"])
        for request in (
            w.Append(2, extent, 6, records, None, 6),
            w.Seal(3, extent, 0),
            w.Drop(4, extent),
            w.CreateExtent(5, "new-extent", PLAIN),
            w.Info(6, [extent]),
            w.Commit(7, extent, 100),
        ):
            assert "allows reads only" in _refused(conn.ask(request), "forbidden")
        # another queue's extent, on the same store host
        assert "does not cover" in _refused(conn.ask(w.Read(8, other, b"", 100)), "forbidden")
        again = conn.ask(w.Read(9, extent, b"", 100))  # the connection goes on reading
        assert isinstance(again, w.ReadResult) and len(again.keys) == 5
    finally:
        conn.close()
    # nothing was appended, sealed or dropped
    reply = httpx.get(f"{node.url}/v1/queues/orders/extents", headers=_h("admin-key")).json()
    (after,) = [e for e in reply["extents"] if e["id"] == extent]
    assert after["status"] == "open" and after["last_seq"] == 5


def test_an_expired_grant_is_refused(node: ServerProcess) -> None:
    extent, address = _plain_extent(node, "orders")
    grant = _grant(node, "orders", {"extents": [extent], "lifetime_seconds": 1})
    conn = _Conn(address, grant)
    try:
        assert conn.welcomed
        deadline = time.monotonic() + 10
        rid = 0
        while True:  # served until it expires, then refused
            rid += 1
            reply = conn.ask(w.Read(rid, extent, b"", 100))
            if isinstance(reply, w.Failed):
                break
            assert isinstance(reply, w.ReadResult) and len(reply.keys) == 5
            assert time.monotonic() < deadline, "a 1 s grant was still good after 10 s"
            time.sleep(0.05)
        assert "expired" in _refused(reply, "grant_expired")
    finally:
        conn.close()
    late = _Conn(address, grant)  # a new connection with it: told why, not served
    try:
        assert late.welcomed
        _refused(late.ask(w.Read(1, extent, b"", 100)), "grant_expired")
    finally:
        late.close()


def test_a_forged_grant_gets_no_byte(node: ServerProcess) -> None:
    extent, address = _plain_extent(node, "orders")
    other, _ = _plain_extent(node, "orders-b")
    grant = _grant(node, "orders", {"extents": [extent]})
    body = msgspec.msgpack.decode(grant.token, type=grants.GrantBody)
    widened = msgspec.msgpack.encode(
        grants.GrantBody(body.version, body.queue, [extent, other], body.expires_ms, body.id)
    )
    for forged in (
        grants.ReadGrant(widened, grant.key, 0, 0),  # another extent added, the same key
        grants.ReadGrant(grant.token, b"k" * 32, 0, 0),  # the token without its key
    ):
        conn = _Conn(address, forged)
        try:
            assert not conn.welcomed
        finally:
            conn.close()
    # a grant hello followed by an oversized "token": closed, nothing read into memory
    first, _ = h.hello(b"k" * 32, h.GRANT_MAGIC)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(first + (1 << 20).to_bytes(4))
        assert sock.recv(100) == b""


def test_a_grant_is_signed_with_the_cluster_secret(node: ServerProcess) -> None:
    """The grant's key is the HMAC of its token under the cluster key: the store host,
    which holds the secret, derives it; the reader holds only what the frontend gave."""
    extent, address = _plain_extent(node, "orders")
    grant = _grant(node, "orders", {"extents": [extent]})
    secret = (node.data_dir / "cluster.secret").read_bytes().strip()
    assert grant.key == grants.grant_key(h.derive_key(secret), grant.token)
