"""The frontend routes the Spark source uses: extents of a queue, a stream-mode group's
offsets and its lag (no Spark needed)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.spark.support import eventually, publish, setup_queue
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


def test_a_stream_groups_lag_in_get_and_metrics(server: ServerProcess) -> None:
    queue = unique()
    setup_queue(server.url, queue, {"s": "stream", "c": "competing"}, min_extents=2)
    base = f"{server.url}/v1/queues/{queue}"
    assert httpx.get(base + "/groups/s").json()["lag"] == {"messages": 0, "seconds": 0.0}
    publish(server.url, queue, [f"m{i}" for i in range(30)])
    time.sleep(0.5)
    lag = httpx.get(base + "/groups/s").json()["lag"]
    assert lag["messages"] == 30 and 0.5 <= lag["seconds"] < 30
    assert "lag" not in httpx.get(base + "/groups/c").json()  # competing: its stats say it

    extents = httpx.get(base + "/extents").json()["extents"]
    ends = {e["id"]: e["last_seq"] + 1 for e in extents if e["kind"] == "plain"}
    fullest = max(ends, key=lambda e: ends[e])
    behind = ends[fullest] - 3  # the group read 2 of the fullest extent, all of the rest
    httpx.post(base + "/groups/s/offsets", json={"offsets": {**ends, fullest: 3}})
    lag = httpx.get(base + "/groups/s").json()["lag"]
    assert lag["messages"] == behind and lag["seconds"] >= 0.5
    metrics = httpx.get(f"{server.url}/metrics").text
    labels = f'{{group="s",queue="{queue}"}}'
    assert f"cherami_group_lag_messages{labels} {float(behind)}" in metrics
    assert f"cherami_group_lag_seconds{labels}" in metrics

    httpx.post(base + "/groups/s/offsets", json={"offsets": ends})
    assert httpx.get(base + "/groups/s").json()["lag"] == {"messages": 0, "seconds": 0.0}


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
    control = ControlClient(server.url)
    (extent,) = [e for e in control.extents(queue) if e.plain]
    grant = control.read_grants(queue, [extent.id])[extent.id]  # no secret here
    dead = "127.0.0.1:1"  # nothing listens there
    with StoreReader([dead, *extent.stores], credential=grant) as reader:
        batches = list(reader.read_range(extent.id, 11, 41))
    seqs = [int.from_bytes(k, "big") for b in batches for k in b.keys]
    assert seqs == list(range(11, 41))


def test_store_reader_renews_a_stale_grant_and_one_the_store_host_says_expired(
    server: ServerProcess,
) -> None:
    """A worker's side of read grants (spark/storereader.py): a grant two thirds through
    its lifetime is replaced before the next connection; a grant the store host calls
    expired (its clock ahead of the reader's) is replaced and the read goes on."""
    from cherami.errors import GrantExpired
    from cherami.spark.control import ControlClient
    from cherami.spark.storereader import StoreReader
    from cherami.wire.grants import ReadGrant

    queue = unique()
    setup_queue(server.url, queue, {})
    publish(server.url, queue, [f"m{i}" for i in range(50)])
    control = ControlClient(server.url)
    (extent,) = [e for e in control.extents(queue) if e.plain]
    stores = list(extent.stores)
    renewed: list[ReadGrant] = []

    def renew() -> ReadGrant:  # a grant that stays fresh while the test runs
        renewed.append(control.read_grants(queue, [extent.id], 60.0)[extent.id])
        return renewed[-1]

    def count(reader: StoreReader) -> int:
        return sum(len(b.keys) for b in reader.read_range(extent.id, 1, 51))

    def expired(grant: ReadGrant) -> bool:
        try:
            with StoreReader(stores, credential=grant) as reader:
                count(reader)
        except GrantExpired:
            return True
        return False

    first = control.read_grants(queue, [extent.id], 1.0)[extent.id]
    with StoreReader(stores, credential=first, renew=renew) as reader:
        assert count(reader) == 50 and not renewed
        eventually(lambda: expired(first), 10)
        assert count(reader) == 50  # on a new connection, with a new grant
        assert len(renewed) == 1
    # the same expired token, which the reader believes good for an hour
    believed = ReadGrant(first.token, first.key, int(time.time() * 1000) + 3_600_000, 3_600_000)
    with StoreReader(stores, credential=believed, renew=renew) as reader:
        assert count(reader) == 50
    assert len(renewed) == 2
