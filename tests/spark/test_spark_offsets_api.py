"""The frontend routes the Spark source uses: extents of a queue and a stream-mode
group's offsets (no Spark needed)."""

from __future__ import annotations

import httpx
import pytest

from tests.spark.support import publish, setup_queue
from tests.support.server import ServerProcess, unique

pytestmark = pytest.mark.spark


def test_extents_and_offsets(server: ServerProcess) -> None:
    queue = unique()
    setup_queue(server.url, queue, {"s": "stream", "c": "competing"}, min_extents=2)
    publish(server.url, queue, [f"m{i}" for i in range(10)])
    base = f"{server.url}/v1/queues/{queue}"

    extents = httpx.get(base + "/extents").json()["extents"]
    plain = sorted(e["id"] for e in extents if e["kind"] == "plain")
    assert len(plain) == 2 and sum(e["last_seq"] for e in extents) == 10
    assert all(e["status"] == "open" and len(e["stores"]) == 2 for e in extents)
    assert {"id", "kind", "status", "sealed_seq", "created_at", "stores", "last_seq"} <= set(
        extents[0]
    )

    assert httpx.get(base + "/groups/s/offsets").json()["offsets"] == {}
    moved = httpx.post(base + "/groups/s/offsets", json={"offsets": {plain[0]: 4, plain[1]: 2}})
    assert moved.status_code == 200 and moved.json()["offsets"] == {plain[0]: 4, plain[1]: 2}
    # forward only: a lower offset changes nothing, a higher one moves the level
    moved = httpx.post(base + "/groups/s/offsets", json={"offsets": {plain[0]: 2, plain[1]: 5}})
    assert moved.json()["offsets"] == {plain[0]: 4, plain[1]: 5}
    assert httpx.get(base + "/groups/s/offsets").json()["offsets"] == {plain[0]: 4, plain[1]: 5}


@pytest.mark.parametrize(
    ("group", "body", "status", "code"),
    [
        ("c", {"offsets": {}}, 400, "invalid_request"),
        ("s", {"offsets": {"nope": 3}}, 400, "invalid_request"),
        ("s", {"offsets": {"x": 0}}, 400, "invalid_request"),
        ("s", {"offsets": []}, 400, "invalid_request"),
        ("s", None, 400, "invalid_request"),
        ("missing", {"offsets": {}}, 404, "group_not_found"),
    ],
)
def test_offsets_errors(
    server: ServerProcess, group: str, body: object, status: int, code: str
) -> None:
    queue = unique()
    setup_queue(server.url, queue, {"s": "stream", "c": "competing"})
    reply = httpx.post(f"{server.url}/v1/queues/{queue}/groups/{group}/offsets", json=body)
    assert reply.status_code == status
    assert reply.json()["error"]["code"] == code


def test_unknown_queue(server: ServerProcess) -> None:
    reply = httpx.get(f"{server.url}/v1/queues/{unique()}/extents")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "queue_not_found"


def test_store_reader_fails_over_to_a_live_replica(server: ServerProcess) -> None:
    from cherami.spark.control import ControlClient
    from cherami.spark.storereader import StoreReader

    queue = unique()
    setup_queue(server.url, queue, {})
    publish(server.url, queue, [f"m{i}" for i in range(50)])
    (extent,) = [e for e in ControlClient(server.url).extents(queue) if e.plain]
    dead = "127.0.0.1:1"  # nothing listens there
    with StoreReader([dead, *extent.stores]) as reader:
        batches = list(reader.read_range(extent.id, 11, 41))
    seqs = [int.from_bytes(k, "big") for b in batches for k in b.keys]
    assert seqs == list(range(11, 41))
