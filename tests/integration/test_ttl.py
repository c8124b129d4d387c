"""Per-message TTL (issue 30) against a real node: a message whose ``expires_in_seconds``
or ``expires_at`` has passed is never delivered, whether it expired in the backlog,
while delayed (a timer extent), while parked after a nack, or in the DLQ (browse and
merge do not bring it back); each is acked past (the backlog empties) and counted in
the group's stats (``expired``) and in ``cherami_group_expired_total``. The TTL fields
come over HTTP, the publish stream and the clients; bad ones are refused 400."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from cherami.client.sync import Client
from cherami.errors import InvalidRequest
from tests.integration.test_metrics import scrape, value
from tests.integration.test_peek import wait_for
from tests.support.server import ServerProcess, unique

TTL = 0.6  # seconds: the short-lived messages' TTL


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def past(ms: int) -> None:
    """Wait until the wall clock is past ``ms`` (a TTL is a time, not an event)."""
    wait_for(f"the clock passes {ms}", lambda: time.time() * 1000 > ms + 50)


def setup(http: httpx.Client, **group: Any) -> tuple[str, str]:
    q = unique("ttl")
    assert http.put(f"/v1/queues/{q}").status_code == 201
    grp = f"/v1/queues/{q}/groups/g"
    assert http.put(grp, json=group).status_code == 201
    return q, grp


def publish(http: httpx.Client, q: str, messages: list[dict[str, Any]]) -> list[str]:
    resp = http.post(f"/v1/queues/{q}/messages", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    ids: list[str] = resp.json()["ids"]
    return ids


def receive_until(http: httpx.Client, grp: str, want: set[str], ack: bool = True) -> list[dict]:
    """Receive (and ack) until every body in ``want`` came; returns every delivery."""
    got: list[dict] = []
    deadline = time.monotonic() + 20
    while not want <= {m["body"] for m in got}:
        assert time.monotonic() < deadline, f"never received {want - {m['body'] for m in got}}"
        batch = http.post(grp + "/receive", json={"max_messages": 100, "wait_seconds": 1}).json()
        got += batch["messages"]
        if ack and batch["messages"]:
            receipts = [m["receipt"] for m in batch["messages"]]
            http.post(grp + "/ack", json={"receipts": receipts})
    return got


def stats(http: httpx.Client, grp: str) -> dict[str, Any]:
    body: dict[str, Any] = http.get(grp).json()["stats"]
    return body


def drained(http: httpx.Client, grp: str, expired: int) -> None:
    """Nothing left: the expired messages were acked past and counted."""
    wait_for("backlog 0", lambda: stats(http, grp)["backlog"] == 0)
    assert stats(http, grp)["expired"] == expired


def test_messages_expiring_in_the_backlog_are_never_delivered(
    server: ServerProcess, http: httpx.Client
) -> None:
    q, grp = setup(http)
    assert http.put(f"/v1/queues/{q}/groups/s").status_code == 201  # consumed on a stream
    until = (datetime.now(UTC) + timedelta(seconds=TTL)).isoformat().replace("+00:00", "Z")
    publish(http, q, [
        *({"body": f"short-{i}", "expires_in_seconds": TTL} for i in range(5)),
        *({"body": f"at-{i}", "expires_at": until} for i in range(3)),
        {"body": "keep-0"},
        {"body": "long-0", "expires_in_seconds": 3600},
    ])  # fmt: skip
    sent = int(time.time() * 1000)

    async def streamed() -> None:  # the publish stream's ttl_ms and expires_ms
        async with AsyncClient(server.url) as c, c.publisher(q) as pub:
            await pub.publish([OutgoingMessage(f"stream-{i}", expires_in_seconds=TTL)
                               for i in range(4)])  # fmt: skip
            await pub.publish([OutgoingMessage("stream-at", expires_at=int(time.time() * 1000))])
            await pub.publish([OutgoingMessage("stream-keep")])

    asyncio.run(streamed())
    past(sent + int(TTL * 1000) + 100)
    got = receive_until(http, grp, {"keep-0", "long-0", "stream-keep"})
    assert sorted(m["body"] for m in got) == ["keep-0", "long-0", "stream-keep"]

    async def consumed() -> list[str]:  # a consume stream's deliveries (runs) alike
        async with AsyncClient(server.url) as c, c.consumer(q, "s", credit=100) as s:
            bodies: list[str] = []
            while len(bodies) < 3:
                batch = await s.get_batch(100, timeout=5)
                bodies += [m.text for m in batch]
                if batch:
                    await s.ack(*batch)
            return sorted(bodies)

    assert asyncio.run(consumed()) == ["keep-0", "long-0", "stream-keep"]
    drained(http, f"/v1/queues/{q}/groups/s", expired=13)
    (long,) = [m for m in got if m["body"] == "long-0"]
    assert long["expires_at"].endswith("Z")
    peeked = http.get(f"/v1/queues/{q}/messages", params={"limit": 100}).json()["messages"]
    assert [m["expires_at"] for m in peeked if m["body"] == "long-0"] == [long["expires_at"]]
    assert "expires_at" not in [m for m in got if m["body"] == "keep-0"][0]
    drained(http, grp, expired=5 + 3 + 4 + 1)
    samples = scrape(http)
    assert value(samples, "cherami_group_expired_total", queue=q, group="g") == 13.0


def test_messages_expiring_while_delayed_are_never_delivered(http: httpx.Client) -> None:
    q, grp = setup(http)
    publish(http, q, [
        *({"body": f"short-{i}", "delay_seconds": 1.5, "expires_in_seconds": TTL}
          for i in range(6)),
        {"body": "keep", "delay_seconds": 1.5},
        {"body": "long", "delay_seconds": 1.5, "expires_in_seconds": 3600},
    ])  # fmt: skip
    # all are due at once: the two that arrive prove the others came due and were passed
    got = receive_until(http, grp, {"keep", "long"})
    assert sorted(m["body"] for m in got) == ["keep", "long"]
    drained(http, grp, expired=6)


def test_a_message_expiring_while_parked_after_a_nack_is_not_redelivered(
    http: httpx.Client,
) -> None:
    q, grp = setup(http, max_delivery_count=10)
    publish(http, q, [{"body": "short", "expires_in_seconds": 1.0}, {"body": "keep"}])
    first = receive_until(http, grp, {"short", "keep"}, ack=False)
    assert sorted(m["body"] for m in first) == ["keep", "short"]
    receipts = [m["receipt"] for m in first]
    assert (
        http.post(grp + "/nack", json={"receipts": receipts, "delay_seconds": 1.5}).json()["nacked"]
        == 2
    )
    again = receive_until(http, grp, {"keep"})  # parked together, due together
    assert [m["body"] for m in again] == ["keep"]
    assert again[0]["delivery_count"] == 2
    drained(http, grp, expired=1)


def test_an_expired_dead_letter_is_neither_browsed_nor_merged_back(http: httpx.Client) -> None:
    q, grp = setup(http, max_delivery_count=1)
    publish(http, q, [{"body": "short", "expires_in_seconds": 2.0}, {"body": "keep"}])
    sent = int(time.time() * 1000)
    first = receive_until(http, grp, {"short", "keep"}, ack=False)
    receipts = [m["receipt"] for m in first]
    http.post(grp + "/nack", json={"receipts": receipts})
    wait_for("both in the DLQ", lambda: len(http.get(grp + "/dlq").json()["messages"]) == 2)
    browsed = http.get(grp + "/dlq").json()["messages"]
    assert {m["body"] for m in browsed} == {"short", "keep"}
    assert [m["body"] for m in browsed if "expires_at" in m] == ["short"]  # kept its TTL
    past(sent + 2000)
    assert [m["body"] for m in http.get(grp + "/dlq").json()["messages"]] == ["keep"]
    assert http.post(grp + "/dlq/merge").json()["merged"] == 2
    again = receive_until(http, grp, {"keep"})
    assert [m["body"] for m in again] == ["keep"]
    drained(http, grp, expired=1)


def test_the_clients_carry_a_ttl_and_bad_ones_are_refused(
    server: ServerProcess, http: httpx.Client
) -> None:
    q, grp = setup(http)
    with Client(server.url) as c:
        at = datetime.now(UTC) + timedelta(hours=1)
        c.publish(q, [OutgoingMessage("a", expires_at=at),
                      OutgoingMessage("b", expires_in_seconds=60)])  # fmt: skip
        got = c.receive(q, "g", max_messages=10, wait_seconds=5)
        assert sorted(m.body for m in got) == [b"a", b"b"]
        c.ack(q, "g", got)

    async def refused() -> None:  # on a stream, the batch's error frame
        async with AsyncClient(server.url) as c, c.publisher(q) as pub:
            with pytest.raises(InvalidRequest, match="at most one of ttl_ms and expires_ms"):
                await pub.publish([OutgoingMessage("x", expires_in_seconds=1, expires_at=1)])

    asyncio.run(refused())
    url = f"/v1/queues/{q}/messages"
    for bad, says in [
        ({"body": "x", "expires_in_seconds": 1, "expires_at": "2030-01-01T00:00Z"}, "at most"),
        ({"body": "x", "expires_in_seconds": 0}, "expires_in_seconds"),
        ({"body": "x", "expires_in_seconds": None}, "expires_in_seconds"),
        ({"body": "x", "expires_at": "tomorrow"}, "expires_at"),
    ]:  # fmt: skip
        resp = http.post(url, json={"messages": [bad]})
        assert resp.status_code == 400, (bad, resp.text)
        assert resp.json()["error"]["code"] == "invalid_request"
        assert says in resp.json()["error"]["message"], resp.text
    wait_for("backlog 0", lambda: stats(http, grp)["backlog"] == 0)  # nothing refused stored
