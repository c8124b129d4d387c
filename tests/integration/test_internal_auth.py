"""Internal links prove they belong to the cluster (issue 14; wire/handshake.py): a store
host answers nothing to a client without the cluster secret, however well-formed its
frames, and nothing to a replayed hello; a client with the secret is served. A node
makes its own secret; a cluster process refuses to start without one, and its
internal HTTP route takes only the cluster's internal token."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import msgspec
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import Unavailable
from cherami.roles.storehost.client import StoreClient
from cherami.roles.storehost.process import StoreProcess
from cherami.wire import handshake as h
from cherami.wire import store as w
from cherami.wire.framing import pack_frame
from cherami.wire.records import Message
from cherami.wire.store import PLAIN
from tests.support.pgcluster import cluster_on_postgres
from tests.support.server import ServerProcess

SECRET = b"0123456789abcdef0123456789abcdef"


async def _no_address(store_id: str, address: str) -> None:
    return None


def _raw_exchange(address: str, data: bytes, timeout: float = 8.0) -> bytes:
    """Send ``data`` on a fresh TCP connection; every byte the store host sends back
    until it closes the connection (or ``timeout``)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except TimeoutError:
            raise AssertionError(f"the store host kept the connection open; got {got!r}") from None
        return got


@pytest.fixture
async def store(tmp_path: Path) -> StoreProcess:
    proc = StoreProcess("s0", str(tmp_path / "s0"), "127.0.0.1", _no_address, SECRET)
    await proc.start()
    try:
        yield proc  # type: ignore[misc]
    finally:
        await proc.stop()


async def test_a_store_host_answers_nothing_without_the_cluster_secret(
    store: StoreProcess,
) -> None:
    key = h.derive_key(SECRET)
    good = StoreClient("s0", store.address, key=key)
    try:
        await good.create_extent("e1", PLAIN)
        (info,) = await good.info(["e1"])
        assert info.extent == "e1"
    finally:
        await good.close()

    # well-formed frames, no hello: an Info for a real extent, and one long enough that
    # the store host reads a whole hello's worth of bytes at once
    for frame in (w.Info(1, ["e1"]), w.Info(2, ["e1"] * 40)):
        got = await asyncio.to_thread(_raw_exchange, store.address, pack_frame(w.encode(frame)))
        assert got == b"", f"a client without the secret got {got!r}"

    # a hello made with another secret, then a frame
    wrong, _ = h.hello(h.derive_key(b"another cluster's secret, 32 bytes"))
    got = await asyncio.to_thread(
        _raw_exchange, store.address, wrong + pack_frame(w.encode(w.Info(3, ["e1"])))
    )
    assert got == b""
    stranger = StoreClient("s0", store.address, key=h.derive_key(b"x" * 32))
    try:
        with pytest.raises(Unavailable, match="refused"):
            await stranger.info(["e1"])
    finally:
        await stranger.close()

    # a good hello is answered once; the same hello again (a replay) is not
    hello, nonce = h.hello(key)
    first = await asyncio.to_thread(_raw_exchange_half, store.address, hello)
    assert h.welcome_ok(key, nonce, first)
    got = await asyncio.to_thread(
        _raw_exchange, store.address, hello + pack_frame(w.encode(w.Info(4, ["e1"])))
    )
    assert got == b"", "a replayed hello was answered"


def _raw_exchange_half(address: str, data: bytes) -> bytes:
    """Send a hello; the welcome (the first 32 bytes back), then hang up."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        got = b""
        while len(got) < h.WELCOME_SIZE:
            chunk = sock.recv(h.WELCOME_SIZE - len(got))
            if not chunk:
                break
            got += chunk
        return got


def test_a_node_makes_its_own_secret_and_its_store_hosts_want_it(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "node").start()
    try:
        path = tmp_path / "node" / "cluster.secret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert len(path.read_text().strip()) >= 32
        stores = _store_addresses(tmp_path / "node")
        assert len(stores) == 3
        for address in stores:
            got = _raw_exchange(address, pack_frame(w.encode(w.Info(1, ["x"] * 40))))
            assert got == b""
    finally:
        server.stop()
    # a restart keeps the secret (a Spark job given the file goes on working)
    before = path.read_text()
    server = ServerProcess(tmp_path / "node").start()
    server.stop()
    assert path.read_text() == before


def _store_addresses(data_dir: Path) -> list[str]:
    """The listening TCP addresses of the node's store-host children (from /proc)."""
    out = subprocess.run(
        ["pgrep", "-f", f"cherami.roles.storehost --data-dir {data_dir}"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    addresses = []
    for pid in out:
        ss = subprocess.run(
            ["ss", "-Hltnp"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        addresses += [line.split()[3] for line in ss if f"pid={pid}," in line]
    return addresses


def test_a_cluster_process_refuses_to_start_without_a_secret(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_CLUSTER_SECRET")}
    done = subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", "serve", "--role", "inputhost",
         "--metadata", f"sqlite:///{tmp_path}/m.db", "--data-dir", str(tmp_path / "d"),
         "--port", "0"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "cluster-secret-file" in done.stderr + done.stdout, done.stderr[-2000:]


@pytest.mark.postgres
async def test_a_cluster_s_internal_links_want_its_secret(tmp_path: Path) -> None:
    counts = {"storehost": 3, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 1}
    with cluster_on_postgres(tmp_path / "c", counts) as (local, _schema):
        key = h.derive_key(h.read_secret_file(str(local.secret_file)))
        for name in local.names("storehost"):
            got = await asyncio.to_thread(
                _raw_exchange,
                local.procs[name].address,
                pack_frame(w.encode(w.Info(1, ["x"] * 40))),
            )
            assert got == b"", f"{name} answered a client without the secret: {got!r}"
        async with AsyncClient(local.url) as client:
            await client.create_queue("internal")
            ids = await client.publish("internal", ["through the API"])
            assert len(ids) == 1
        url = f"http://{local.procs['inputhost-0'].address}/internal/v1/queues/internal/messages"
        body = msgspec.msgpack.encode([Message(b"smuggled")])
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {h.INTERNAL_HEADER: "0" * 64}, {"Authorization": "Bearer x"}):
                async with session.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 401, (headers, resp.status, await resp.text())
            token = {h.INTERNAL_HEADER: h.internal_token(key)}
            async with session.post(url, data=body, headers=token) as resp:
                assert resp.status == 200, await resp.text()
