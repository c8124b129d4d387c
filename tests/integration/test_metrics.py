"""/metrics against a real node: after a known workload the series equal the known
counts, the oldest unacked age grows while a message is held, and a deleted queue's
series are gone."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess, unique


def scrape(http: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample as ``(name, labels) -> value``."""
    resp = http.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:  # fmt: skip
    return samples.get((name, frozenset(labels.items())))


def test_known_workload_is_counted_and_a_deleted_queue_leaves(server: ServerProcess) -> None:
    q, g = unique(), "workers"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put(f"/v1/queues/{q}").status_code == 201
        grp = f"/v1/queues/{q}/groups/{g}"
        assert http.put(grp, json={"max_delivery_count": 1}).status_code == 201
        msgs = [{"body": f"m{i}"} for i in range(3)]
        assert http.post(f"/v1/queues/{q}/messages", json={"messages": msgs}).status_code == 200
        asyncio.run(stream_publish(server.url, q, ["m3", "m4"]))  # one batch on a stream
        got: list[dict[str, str]] = []
        while len(got) < 5:
            batch = http.post(grp + "/receive", json={"max_messages": 5 - len(got)}).json()
            got += batch["messages"]
        receipts = [m["receipt"] for m in got]
        assert http.post(grp + "/ack", json={"receipts": receipts[:3]}).json()["acked"] == 3
        assert http.post(grp + "/nack", json={"receipts": receipts[3:4]}).json()["nacked"] == 1
        # receipts[4] stays in flight; the nacked one had its one delivery: to the DLQ
        deadline = time.monotonic() + 15
        while http.get(grp).json()["stats"]["dlq_depth"] < 1:
            assert time.monotonic() < deadline, "the nacked message never reached the DLQ"
            time.sleep(0.1)

        first = scrape(http)
        qg = {"queue": q, "group": g}
        expected = {
            "cherami_messages_published_total": ({"queue": q}, 5.0),
            "cherami_publish_latency_seconds_count": ({"queue": q}, 2.0),
            "cherami_group_delivered_total": (qg, 5.0),
            "cherami_group_acked_total": (qg, 3.0),
            "cherami_group_nacked_total": (qg, 1.0),
            "cherami_group_redelivered_total": (qg, 0.0),
            "cherami_group_dead_lettered_total": (qg, 1.0),
            "cherami_group_in_flight_messages": (qg, 1.0),
            "cherami_group_backlog_messages": (qg, 1.0),
            "cherami_group_dlq_messages": (qg, 1.0),
            "cherami_group_end_to_end_latency_seconds_count": (qg, 3.0),
            "cherami_group_end_to_end_latency_seconds_bucket": ({**qg, "le": "+Inf"}, 3.0),
        }
        for name, (labels, want) in expected.items():
            assert value(first, name, **labels) == want, name
        stats = http.get(f"/v1/queues/{q}").json()["stats"]
        assert value(first, "cherami_queue_open_extents", queue=q) == stats["open_extents"] >= 1
        assert value(first, "cherami_queue_sealed_extents", queue=q) == stats["sealed_extents"]
        assert value(first, "cherami_queue_stored_bytes", queue=q) == stats["bytes_stored"] > 0
        # the process-wide series: appends to each store host, metadata calls, hosts
        appends = [v for (n, _), v in first.items()
                   if n == "cherami_store_append_latency_seconds_count"]  # fmt: skip
        assert appends and sum(appends) >= 1
        batches = [v for (n, _), v in first.items()
                   if n == "cherami_store_append_batch_messages_sum"]  # fmt: skip
        assert sum(batches) >= 5 * len(batches)  # every replica got both batches
        assert (value(first, "cherami_metadata_call_latency_seconds_count", op="get_queue")
                or 0) >= 1  # fmt: skip
        up = [v for (n, labels), v in first.items() if n == "cherami_host_up"]
        assert len(up) >= 5 and all(v == 1.0 for v in up)  # 4 roles and the store hosts

        # the held message ages
        age = value(first, "cherami_group_oldest_unacked_age_seconds", **qg)
        assert age is not None and age > 0
        time.sleep(1.2)
        later = value(scrape(http), "cherami_group_oldest_unacked_age_seconds", **qg)
        assert later is not None and later >= age + 1.0

        assert http.delete(f"/v1/queues/{q}").status_code == 204
        gone = scrape(http)
        left = [key for key in gone if ("queue", q) in key[1]]
        assert left == []


async def stream_publish(url: str, queue: str, bodies: list[str]) -> None:
    async with AsyncClient(url) as client, client.publisher(queue) as publisher:
        await (await publisher.send(bodies))


def test_help_and_units(server: ServerProcess) -> None:
    """Every family has help text; counters end in _total; names carry their unit."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        text = http.get("/metrics").text
    families = list(text_string_to_metric_families(text))
    assert len(families) >= 20
    for family in families:
        assert family.name.startswith("cherami_") and family.documentation, family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        if family.type in ("gauge", "histogram") and family.name != "cherami_host_up":
            units = (
                "_seconds",
                "_messages",
                "_bytes",
                "_extents",
                "_connections",
                "_groups",
                "_requests",
            )
            assert family.name.endswith(units), family.name


def test_a_scrape_reads_in_bulk_not_per_queue(tmp_path: Path) -> None:
    """A scrape of a node with 20 queues x 2 groups reads the metadata a fixed number of
    times, not once or more per queue or group (it read each queue's extents and each
    group's DLQ, and asked a store host about each extent one at a time); the series
    are all still there, and the one group with a dead letter shows it."""
    server = ServerProcess(tmp_path / "node").start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            queues = [f"bulk{i}" for i in range(20)]
            for q in queues:
                assert http.put(f"/v1/queues/{q}").status_code == 201
                for g in ("a", "b"):
                    put = http.put(f"/v1/queues/{q}/groups/{g}", json={"max_delivery_count": 1})
                    assert put.status_code == 201
                msgs = {"messages": [{"body": "m"}]}
                assert http.post(f"/v1/queues/{q}/messages", json=msgs).status_code == 200
            grp = "/v1/queues/bulk0/groups/a"
            got: list[dict[str, str]] = []
            deadline = time.monotonic() + 15
            while not got:
                assert time.monotonic() < deadline, "no delivery"
                got = http.post(grp + "/receive", json={"max_messages": 1}).json()["messages"]
            assert http.post(grp + "/nack", json={"receipts": [got[0]["receipt"]]}).status_code
            while http.get(grp).json()["stats"]["dlq_depth"] < 1:
                assert time.monotonic() < deadline, "the nacked message never reached the DLQ"
                time.sleep(0.1)

            def reads(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> Counter[str]:
                return Counter({dict(labels)["op"]: v for (n, labels), v in samples.items()
                                if n == "cherami_metadata_call_latency_seconds_count"
                                and dict(labels)["op"] in PER_QUEUE_READS})  # fmt: skip

            before = scrape(http)
            for _ in range(3):
                last = scrape(http)
            # 3 scrapes: the one DLQ with a dead letter costs 2 reads each, and the
            # node's own background work a few (the leader looking at the DLQ that
            # opened); the old scrape made 20 + 2 x 40 + 40 of these reads each time
            made = reads(last) - reads(before)
            assert sum(made.values()) <= 30, made
            for q in queues:
                for g in ("a", "b"):
                    backlog = value(last, "cherami_group_backlog_messages", queue=q, group=g)
                    assert backlog == (0.0 if (q, g) == ("bulk0", "a") else 1.0), (q, g)
                assert value(last, "cherami_queue_open_extents", queue=q) == 1.0
                assert (value(last, "cherami_queue_stored_bytes", queue=q) or 0) > 0
            assert value(last, "cherami_group_dlq_messages", queue="bulk0", group="a") == 1.0
            assert value(last, "cherami_group_dlq_messages", queue="bulk1", group="a") == 0.0
    finally:
        server.stop()


# what the scrape read once per queue or per group before (list_groups: stream lags)
PER_QUEUE_READS = ("list_extents", "get_ack_levels", "list_groups", "get_group")


def test_creating_queues_costs_a_store_request_per_replica(server: ServerProcess) -> None:
    """Opening an extent creates it on its replicas and asks the store hosts nothing
    else: the live store hosts' pings and the hosts table are read once per placement
    view (storeview.py), not at every extent (that doubled the store requests of
    creating queues)."""
    queues = [unique() for _ in range(40)]

    async def create() -> None:
        async with AsyncClient(server.url, timeout=60) as client:
            limit = asyncio.Semaphore(8)

            async def one(q: str) -> None:
                async with limit:
                    await client.create_queue(q)

            await asyncio.gather(*(one(q) for q in queues))

    with httpx.Client(base_url=server.url, timeout=30) as http:
        before = scrape(http)
        asyncio.run(create())
        after = scrape(http)

    def delta(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0.0) - (value(before, name, **labels) or 0.0)

    creates = delta("cherami_store_requests_total", op="CreateExtent")
    infos = delta("cherami_store_requests_total", op="Info")
    assert creates >= len(queues)  # an extent each, on each of its replicas
    assert infos <= creates / 4, (creates, infos)  # the old code pinged at every extent
    lists = delta("cherami_metadata_call_latency_seconds_count", op="list_hosts")
    assert lists <= len(queues) / 4, lists
