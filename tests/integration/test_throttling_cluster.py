"""Publish limits in a cluster (docs/operations.md §9, "Publish limits"): a queue whose
open extents sit on 2 input hosts is limited by both together (each enforces its share),
and a 429 forwarded by a frontend keeps its Retry-After; SIGHUP reloads the auth file in
every role process. Real processes on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.roles.frontend.auth import hash_key
from tests.support.pgcluster import cluster_fixture
from tests.support.server import unique

RATE = 200.0
ADMIN, ADDED = "chk_cluster-admin", "chk_added-on-sighup"


def _write_keys(path: Path, **scopes: str) -> None:
    """The auth file: each key (hashed) with its one scope."""
    entries = [{"key_sha256": hash_key(k).hex(), "scopes": [s]} for k, s in scopes.items()]
    path.write_text(json.dumps(entries))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    _write_keys(path, **{ADMIN: "admin"})
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, keys: Path) -> Iterator[LocalCluster]:
    counts = {"storehost": 1, "controller": 1, "inputhost": 2, "outputhost": 1, "frontend": 1}
    auth = ["--auth-file", str(keys)]
    yield from cluster_fixture(tmp_path_factory, "throttle-cluster", counts, auth)


async def test_a_queues_limit_holds_over_its_input_hosts(cluster: LocalCluster) -> None:
    q = unique()
    async with AsyncClient(cluster.url, ADMIN) as client:
        await client.create_queue(q, replicas=1, min_extents=2, publish_rate=RATE,
                                  publish_burst=20)  # fmt: skip
        deadline = time.monotonic() + 30
        while len((await client.request("GET", f"/v1/queues/{q}/publishers"))["input_hosts"]) < 2:
            assert time.monotonic() < deadline, "the queue never had extents on 2 input hosts"
            await asyncio.sleep(0.2)
        # through the frontend: a refusal by an input host comes back with its Retry-After
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with httpx.AsyncClient(base_url=cluster.url, headers=headers) as http:
            body = {"messages": [{"body": "x"}] * 10}
            replies = [await http.post(f"/v1/queues/{q}/messages", json=body) for _ in range(6)]
        refused = [r for r in replies if r.status_code == 429]
        assert refused and all(r.status_code in (200, 429) for r in replies)
        assert refused[0].headers["Retry-After"] == "1"
        assert refused[0].json()["error"]["code"] == "throttled"

        async def pump(seconds: float) -> int:
            end, sent = time.monotonic() + seconds, 0
            while time.monotonic() < end:
                sent += len(await client.publish(q, [b"m"] * 10))
            return sent

        await asyncio.sleep(0.5)
        seconds = 4.0
        sent = sum(await asyncio.gather(*(pump(seconds) for _ in range(4))))
        extents = (await client.request("GET", f"/v1/queues/{q}/extents"))["extents"]
    stored = Counter({e["input_host"]: e["last_seq"] for e in extents if e["kind"] == "plain"})
    rate = sent / seconds
    print(f"queue limit {RATE:.0f}/s over 2 input hosts: {rate:.0f}/s, stored per host "
          f"{dict(stored)}")  # fmt: skip
    assert len(stored) == 2 and min(stored.values()) > 0
    assert RATE * 0.6 <= rate <= RATE * 1.15


async def test_sighup_reloads_the_auth_file_in_every_role_process(
    cluster: LocalCluster, keys: Path
) -> None:
    q = unique()
    async with AsyncClient(cluster.url, ADMIN) as admin:
        await admin.create_queue(q, replicas=1)
    body = {"messages": [{"body": "x"}]}
    headers = {"Authorization": f"Bearer {ADDED}"}
    async with httpx.AsyncClient(base_url=cluster.url, headers=headers) as http:
        assert (await http.post(f"/v1/queues/{q}/messages", json=body)).status_code == 401
        _write_keys(keys, **{ADMIN: "admin", ADDED: "produce"})
        for name in cluster.procs:  # store hosts too: SIGHUP must stop none of them
            cluster.signal(name, signal.SIGHUP)
        deadline = time.monotonic() + 5
        # accepted by the frontend and, forwarded, by the input host: both reloaded
        while (reply := await http.post(f"/v1/queues/{q}/messages", json=body)).status_code != 200:
            assert reply.status_code == 401 and time.monotonic() < deadline, reply.text
            await asyncio.sleep(0.1)
        assert (await http.get("/healthz")).status_code == 200
    alive = {n: p.popen.poll() is None for n, p in cluster.procs.items() if p.popen is not None}
    assert alive and all(alive.values()), alive
