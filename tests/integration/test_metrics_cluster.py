"""In a cluster every role process serves its own /metrics with what it holds: the
input host its publishes and its synced appends to the store host, the output host the
group's counts, the controller the queue's extents and the hosts, the store host (on
--metrics-port) its append rounds. Real processes on PostgreSQL metadata."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cherami.client import AsyncClient
from cherami.devcluster.local import LocalCluster
from cherami.errors import CheramiError
from tests.support.pgcluster import cluster_fixture
from tests.support.server import unique

COUNTS = {"storehost": 1, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from cluster_fixture(tmp_path_factory, "metrics", COUNTS, ["--metrics-port", "0"])


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url, timeout=30).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:  # fmt: skip
    want = set(labels.items())
    return sum(v for (n, lbl), v in found.items() if n == name and want <= lbl)


def test_every_role_process_reports_what_it_holds(cluster: LocalCluster) -> None:
    q, g = unique(), "g"
    with httpx.Client(base_url=cluster.url, timeout=30) as http:
        assert http.put(f"/v1/queues/{q}", json={"replicas": 1}).status_code == 201
        assert http.put(f"/v1/queues/{q}/groups/{g}").status_code == 201
        msgs = {"messages": [{"body": str(i)} for i in range(4)]}
        deadline = time.monotonic() + 30
        while (r := http.post(f"/v1/queues/{q}/messages", json=msgs)).status_code != 200:
            assert time.monotonic() < deadline, r.text  # until the queue's extents are open
            time.sleep(0.2)
        got: list[dict[str, str]] = []
        while len(got) < 4:
            ask = {"max_messages": 4 - len(got), "wait_seconds": 5}
            got += http.post(f"/v1/queues/{q}/groups/{g}/receive", json=ask).json()["messages"]
        acked = http.post(f"/v1/queues/{q}/groups/{g}/ack", json={"receipts": [got[0]["receipt"]]})
        assert acked.json()["acked"] == 1

    def url(name: str) -> str:
        return f"http://{cluster.procs[name].address}/metrics"

    store = cluster.procs["storehost-0"]
    logged = re.findall(r"metrics at (http\S+)", store.log.read_text())
    assert logged, "the store host did not say where its /metrics is"

    inputs = samples(url("inputhost-0"))
    assert total(inputs, "cherami_messages_published_total", queue=q) == 4
    appends = total(inputs, "cherami_store_append_latency_seconds_count", store=store_id(cluster))
    assert appends >= 1
    outputs = samples(url("outputhost-0"))
    qg = {"queue": q, "group": g}
    assert total(outputs, "cherami_group_delivered_total", **qg) == 4
    assert total(outputs, "cherami_group_acked_total", **qg) == 1
    assert total(outputs, "cherami_group_in_flight_messages", **qg) == 3
    assert total(outputs, "cherami_group_backlog_messages", **qg) == 3
    controller = samples(url("controller-0"))
    assert total(controller, "cherami_queue_open_extents", queue=q) >= 1
    assert total(controller, "cherami_queue_stored_bytes", queue=q) > 0
    assert total(controller, "cherami_host_up") == 5  # every process heartbeats
    assert total(controller, "cherami_metadata_call_latency_seconds_count") > 0
    frontend = samples(url("frontend-0"))  # forwarded the publish: not counted twice
    assert total(frontend, "cherami_messages_published_total", queue=q) == 0
    stores = samples(logged[-1])
    rounds = total(stores, "cherami_storehost_append_round_seconds_count")
    assert rounds >= 1
    # the 4 messages of the publish went through its append rounds
    assert total(stores, "cherami_storehost_append_round_messages_sum") >= 4
    assert total(stores, "cherami_storehost_open_extents") >= 1
    # a cluster's own connections all say a good hello: none refused, and the series is there
    assert [
        v for (n, _), v in stores.items() if n == "cherami_storehost_refused_connections_total"
    ] == [0]


def store_id(cluster: LocalCluster) -> str:
    with httpx.Client(base_url=cluster.url, timeout=30) as http:
        hosts = http.get("/v1/cluster").json()["hosts"]
    return str(next(h["id"] for h in hosts if h["role"] == "storehost"))


async def test_acks_of_many_groups_at_once_are_few_metadata_writes(cluster: LocalCluster) -> None:
    """The output host writes the ack levels of the units a flush holds in one fenced
    write, not one transaction a unit (4,000 after a power loss at 1,000 queues): 24
    groups acked at once cost fewer writes than groups, counted by its /metrics."""
    q, groups = unique(), [f"g{i}" for i in range(24)]
    async with AsyncClient(cluster.url) as client:
        await client.create_queue(q, replicas=1)
        for g in groups:
            await client.create_group(q, g)
        deadline = time.monotonic() + 30
        while True:  # until the queue's extents are open
            try:
                await client.publish(q, "one")
                break
            except CheramiError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        got = {}
        for g in groups:
            while not (batch := await client.receive(q, g, max_messages=1, wait_seconds=5)):
                assert time.monotonic() < deadline
            got[g] = batch[0].receipt or ""
        metrics = f"http://{cluster.procs['outputhost-0'].address}/metrics"
        op = "cherami_metadata_call_latency_seconds_count"
        before = await asyncio.to_thread(samples, metrics)
        acked = await asyncio.gather(*(client.ack(q, g, [got[g]]) for g in groups))
        assert all(a["acked"] == 1 for a in acked), acked
        after = await asyncio.to_thread(samples, metrics)

    def calls(name: str) -> float:
        return total(after, op, op=name) - total(before, op, op=name)

    assert calls("put_ack_levels") == 0  # before: 24, a write a group
    # a write a flush: the first ack's flush starts at once, the others share the next
    # ones (10 flushes in a run beside a cluster benchmark, 24 requests at once)
    assert 1 <= calls("put_fenced_ack_levels") < len(groups)
