"""TLS end to end (issue 14), with a CA made by the test (openssl): a node serving https
and wss to the Python client, the CLI and streams; a cluster whose every listener and
internal link (forwards, store links, internal publishes) runs TLS; a client that trusts
another CA is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import Unavailable
from tests.support.pgcluster import cluster_on_postgres
from tests.support.server import ServerProcess
from tests.support.tlscerts import Certs, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def node(tmp_path: Path, certs: Certs) -> Iterator[ServerProcess]:
    extra = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    server = ServerProcess(tmp_path / "node", extra=extra, ca=certs.ca).start()
    try:
        yield server
    finally:
        server.stop()


async def _round_trip(url: str, ca: Path, queue: str, n: int = 300) -> None:
    """HTTP and stream publishing, HTTP and stream consuming, all over TLS."""
    async with AsyncClient(url, tls_ca=str(ca)) as client:
        await client.create_queue(queue)
        await client.create_group(queue, "http")
        await client.create_group(queue, "stream")
        sent = {f"http-{i}" for i in range(n)}
        await client.publish(queue, sorted(sent))
        async with client.publisher(queue) as publisher:
            streamed = {f"stream-{i}" for i in range(n)}
            await publisher.publish(sorted(streamed))
        sent |= streamed

        # a cluster's output host takes no lease in its first 2 s (outage.py), so the
        # first receives of a just-started cluster may be empty: a deadline, not one try
        got: set[str] = set()
        deadline = asyncio.get_running_loop().time() + 20
        while got != sent:
            batch = await client.receive(queue, "http", max_messages=500, wait_seconds=2)
            left = deadline - asyncio.get_running_loop().time()
            assert batch or left > 0, f"HTTP receive over TLS ran dry: {len(sent - got)} missing"
            got |= {m.text for m in batch}
            if batch:
                await client.ack(queue, "http", [m.receipt or "" for m in batch])

        got = set()
        async with client.consumer(queue, "stream") as consumer:
            while got != sent:
                m = await consumer.get(timeout=10)
                assert m is not None, f"stream over TLS ran dry: {len(sent - got)} missing"
                got.add(m.text)
                consumer.ack(m)


async def test_a_node_serves_https_and_wss_with_the_test_ca(
    node: ServerProcess, certs: Certs
) -> None:
    assert node.url.startswith("https://")
    await _round_trip(node.url, certs.ca, "tls-node")

    async with AsyncClient(node.url, tls_ca=str(certs.other_ca)) as stranger:
        with pytest.raises(Unavailable, match="certificate verify failed"):
            await stranger.list_queues()
    async with AsyncClient(node.url.replace("https://", "http://")) as plain:
        with pytest.raises(Unavailable):
            await plain.list_queues()

    env = {**os.environ, "CHERAMI_TLS_CA": str(certs.ca)}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cherami.cli.main", "queue", "list", "--url", node.url],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tls-node" in done.stdout

    # --tls-ca before the command is used too, and beats CHERAMI_TLS_CA: the other CA
    # given there fails a verification the environment's CA would pass
    for ca, code in ((certs.ca, 0), (certs.other_ca, 5)):
        before = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "cherami.cli.main", "--tls-ca", str(ca), "--url", node.url,
             "queue", "list"],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )  # fmt: skip
        assert before.returncode == code, before.stderr
    assert "certificate verify failed" in before.stderr


@pytest.mark.postgres
async def test_a_cluster_runs_tls_on_every_listener_and_internal_link(
    tmp_path: Path, certs: Certs
) -> None:
    counts = {"storehost": 3, "controller": 1, "inputhost": 2, "outputhost": 1, "frontend": 1}
    tls = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key), "--tls-ca", str(certs.ca)]
    with cluster_on_postgres(tmp_path / "c", counts, extra_args=tls) as (local, _schema):
        assert local.url.startswith("https://")
        # through the frontend: forwards to the input and output hosts, and their store
        # links, all over TLS (a plain connection to any of them is refused)
        await _round_trip(local.url, certs.ca, "tls-cluster")
        for name in local.names("storehost") + local.names("inputhost"):
            host, port = local.procs[name].address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 64)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(1024), 10)
            writer.close()
            assert b"200" not in answer and b"ok" not in answer, (name, answer[:100])
