"""GET /v1/cluster, the extents' input host and rate, and ``cherami cluster status`` on
a single node (its roles are the hosts; its store hosts are child processes)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.errors import InvalidRequest
from tests.integration.test_cli import cherami, ok
from tests.support.server import ServerProcess, unique


async def _publish_for(client: AsyncClient, queue: str, seconds: float) -> int:
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await client.publish(queue, [f"m{sent + i}" for i in range(50)])
        sent += 50
        await asyncio.sleep(0.02)
    return sent


async def test_cluster_view_of_a_node(server: ServerProcess, client: AsyncClient) -> None:
    queue = unique("view")
    created = await client.create_queue(queue, replicas=2)
    assert (created["min_extents"], created["max_extents"]) == (1, 16)  # a node: 1
    assert created["extent_target_rate"] == 20_000
    await _publish_for(client, queue, 4.5)  # the node's load reports come every 2 s

    body = await client.request("GET", "/v1/cluster")
    roles = sorted(h["role"] for h in body["hosts"])
    assert roles.count("storehost") == 3
    assert {"frontend", "controller", "inputhost", "outputhost"} <= set(roles)
    address = server.url.removeprefix("http://")
    by_role = {h["role"]: h for h in body["hosts"]}
    inputs = by_role["inputhost"]
    assert inputs["alive"] and inputs["address"] == address and inputs["zone"] == ""
    assert inputs["load"]["disk_free_bytes"] > 0 and inputs["load"]["cpu"] >= 0
    stores = [h for h in body["hosts"] if h["role"] == "storehost"]
    assert all(h["alive"] and h["load"]["disk_total_bytes"] > 0 for h in stores)

    (mine,) = [q for q in body["queues"] if q["name"] == queue]
    plain = [e for e in mine["extents"] if e["kind"] == "plain"]
    assert len(plain) == 1
    assert plain[0]["input_host"] == address and len(plain[0]["stores"]) == 2
    assert plain[0]["rate"] > 100  # ~2,000 msgs/s published
    assert inputs["load"]["extents"][plain[0]["id"]]["msgs_in"] > 100

    extents = (await client.request("GET", f"/v1/queues/{queue}/extents"))["extents"]
    (listed,) = [e for e in extents if e["id"] == plain[0]["id"]]
    assert listed["input_host"] == address and listed["rate"] > 100

    text = ok(server, "cluster", "status")
    assert "APPEND P99" in text and plain[0]["id"] in text and "storehost" in text
    as_json = json.loads(ok(server, "cluster", "status", "--json"))
    assert {h["id"] for h in as_json["hosts"]} == {h["id"] for h in body["hosts"]}


async def test_extent_bounds_are_checked(server: ServerProcess, client: AsyncClient) -> None:
    queue = unique("bounds")
    result = cherami(server, "queue", "create", queue, "--min-extents", "4", "--max-extents", "2")
    assert result.returncode != 0 and "min_extents 4 exceeds max_extents 2" in result.stderr
    made = await client.create_queue(queue, min_extents=2, max_extents=4,
                                     extent_target_rate=500)  # fmt: skip
    assert (made["min_extents"], made["max_extents"], made["extent_target_rate"]) == (2, 4, 500)
    patched = await client.update_queue(queue, max_extents=8, extent_target_rate=1000)
    assert (patched["max_extents"], patched["extent_target_rate"]) == (8, 1000)
    with pytest.raises(InvalidRequest, match="min_extents 2 exceeds max_extents 1"):
        await client.update_queue(queue, max_extents=1)
