"""Message-store reads (``GET /v1/queues/{queue}/messages``, issue 30) against a real
node whose extents roll over every few dozen messages: since/until/limit/order on a
known set of messages, paging that shows every message once across sealed and open
extents (while more are published, and across a store host's SIGKILL and restart), a
group's stats untouched, the refusals, and the same read through the clients and the
CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.client.sync import Client
from cherami.errors import Forbidden
from tests.support.server import ServerProcess, keyed_node, unique

EXTENT_MAX = 30  # an extent this large rolls over
ADMIN, PRODUCER, READER = "admin-key", "prod-key", "read-key"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = keyed_node(tmp_path_factory.mktemp("peek"), [
        {"key": ADMIN, "scopes": ["admin"]},
        {"key": PRODUCER, "scopes": ["produce"]},
        {"key": READER, "scopes": ["consume"]},
    ], extra=("--extent-max-messages", str(EXTENT_MAX)))  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture
def http(node: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=node.url, headers=headers, timeout=30) as client:
        yield client


def wait_for(what: str, check: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not in {seconds} s: {what}"
        time.sleep(0.05)


def publish(http: httpx.Client, queue: str, bodies: list[str]) -> list[str]:
    answer = http.post(f"/v1/queues/{queue}/messages",
                       json={"messages": [{"body": b} for b in bodies]})  # fmt: skip
    assert answer.status_code == 200, answer.text
    ids: list[str] = answer.json()["ids"]
    return ids


def sealed(http: httpx.Client, queue: str) -> int:
    count: int = http.get(f"/v1/queues/{queue}").json()["stats"]["sealed_extents"]
    return count


def fill(http: httpx.Client, queue: str, rounds: int = 3) -> list[str]:
    """Messages in ``rounds`` sealed extents (each round waits for its extent to roll
    over) and then some in the open one."""
    ids: list[str] = []
    for r in range(rounds):
        ids += publish(http, queue, [f"{queue} r{r} m{i}" for i in range(EXTENT_MAX + 5)])
        wait_for(f"extent {r + 1} sealed", lambda r=r: sealed(http, queue) > r)  # type: ignore[misc]
    return ids + publish(http, queue, [f"{queue} open m{i}" for i in range(10)])


def page(http: httpx.Client, queue: str, **params: Any) -> dict[str, Any]:
    answer = http.get(f"/v1/queues/{queue}/messages", params=params)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def every_page(
    http: httpx.Client, queue: str, between: Callable[[int], None] | None = None,
    cursor: str | None = None, **params: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every message, page after page from ``cursor`` (``between(n)`` after page n)."""
    shown: list[dict[str, Any]] = []
    for n in range(1000):
        body = page(http, queue, **params, **({"cursor": cursor} if cursor else {}))
        shown += body["messages"]
        cursor = body["cursor"]
        if cursor is None:
            return shown
        if between is not None:
            between(n)
    raise AssertionError("the pages never ended")


def ids_of(messages: list[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


def ms(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.fixture(scope="module")
def filled(node: ServerProcess) -> tuple[str, list[str]]:
    """One queue for the module (filling it takes seconds): the tests that publish to it
    add their messages' ids to the list."""
    queue = unique("peek")
    with httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        assert http.put(f"/v1/queues/{queue}").status_code == 201
        assert http.put(f"/v1/queues/{queue}/groups/g").status_code == 201
        return queue, fill(http, queue)


def test_pages_show_every_message_once_across_sealed_and_open_extents(
    http: httpx.Client, filled: tuple[str, list[str]]
) -> None:
    queue, ids = filled
    assert sealed(http, queue) >= 3
    whole = page(http, queue, limit=1000)
    assert whole["cursor"] is None
    assert sorted(ids_of(whole["messages"])) == sorted(ids)
    times = [ms(m["enqueued_at"]) for m in whole["messages"]]
    assert times == sorted(times)
    first = whole["messages"][0]
    assert first["body"] == f"{queue} r0 m0" and first["attributes"] == {}
    assert "receipt" not in first and "delivery_count" not in first
    # page after page: the same order, each message once, oldest or newest first
    assert every_page(http, queue, limit=7) == whole["messages"]
    assert every_page(http, queue, limit=9, order="desc") == whole["messages"][::-1]
    # published while an asc listing pages: shown once too, nothing twice
    more: list[str] = []

    def publish_more(n: int) -> None:
        if n < 4:
            more.extend(publish(http, queue, [f"{queue} late {n} m{i}" for i in range(12)]))

    shown = ids_of(every_page(http, queue, publish_more, limit=10))
    ids += more
    assert len(shown) == len(set(shown))
    assert sorted(shown) == sorted(ids)


def test_since_until_limit_and_order_select_the_known_messages(
    http: httpx.Client, filled: tuple[str, list[str]]
) -> None:
    queue, _ = filled
    every = page(http, queue, limit=1000)["messages"]
    times = [m["enqueued_at"] for m in every]
    cut = next(i for i in range(len(times) // 2, len(times)) if times[i] != times[i - 1])
    t = times[cut]
    later = [m for m in every if m["enqueued_at"] >= t]
    earlier = [m for m in every if m["enqueued_at"] < t]
    assert later and earlier
    assert every_page(http, queue, since=t, limit=11) == later
    assert every_page(http, queue, since=str(ms(t)), limit=1000) == later
    assert every_page(http, queue, until=t, limit=11) == earlier
    assert every_page(http, queue, until=t, order="desc", limit=4) == earlier[::-1]
    first, last = every[3]["enqueued_at"], every[-3]["enqueued_at"]
    inside = [m for m in every if first <= m["enqueued_at"] < last]
    assert every_page(http, queue, since=first, until=last, order="desc", limit=6) == inside[::-1]
    assert page(http, queue, since=last, until=first)["messages"] == []
    # the same instant with an offset
    offset = datetime.fromisoformat(t.replace("Z", "+00:00")).astimezone().isoformat()
    assert every_page(http, queue, since=offset, limit=1000) == later
    newest = page(http, queue, order="desc", limit=5)
    assert newest["messages"] == every[::-1][:5] and newest["cursor"] is not None
    assert page(http, queue, limit=3)["messages"] == every[:3]
    assert len(page(http, queue)["messages"]) == min(100, len(every))  # the default limit


def test_a_groups_stats_are_unchanged_by_peeking(
    http: httpx.Client, filled: tuple[str, list[str]]
) -> None:
    queue, ids = filled
    group = f"/v1/queues/{queue}/groups/g"
    received = http.post(group + "/receive", json={"max_messages": 5, "wait_seconds": 5})
    assert len(received.json()["messages"]) == 5
    wait_for("the group's stats", lambda: http.get(group).json()["stats"]["in_flight"] == 5
             and http.get(group).json()["stats"]["backlog"] == len(ids))  # fmt: skip
    before = http.get(group).json()["stats"]
    every_page(http, queue, limit=50)
    every_page(http, queue, limit=50, order="desc")
    after = http.get(group).json()["stats"]
    keys = ("backlog", "in_flight", "delivered", "acked", "redelivered", "dlq_depth")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
    # the group goes on from where it was: the next receive is not what a peek showed
    again = http.post(group + "/receive", json={"max_messages": 5, "wait_seconds": 5}).json()
    assert {m["id"] for m in again["messages"]}.isdisjoint(
        m["id"] for m in received.json()["messages"]
    )


def _store_pids(node: ServerProcess) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"cherami.roles.storehost --data-dir {node.data_dir}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return sorted(int(pid) for pid in found.stdout.split())


def test_paging_goes_on_across_a_store_hosts_restart(
    node: ServerProcess, http: httpx.Client, filled: tuple[str, list[str]]
) -> None:
    queue, ids = filled
    pids = _store_pids(node)
    assert len(pids) == 3, pids
    first = page(http, queue, limit=20)
    newest = page(http, queue, limit=20, order="desc")
    os.kill(pids[0], signal.SIGKILL)
    # read from the other replicas while it is down, then after it came back
    rest = every_page(http, queue, limit=20, cursor=first["cursor"])
    shown = ids_of(first["messages"] + rest)
    assert sorted(shown) == sorted(ids)
    wait_for("the store host restarted", lambda: len(_store_pids(node)) == 3
             and pids[0] not in _store_pids(node), 30)  # fmt: skip
    older = every_page(http, queue, cursor=newest["cursor"], limit=20)  # after the restart
    assert sorted(ids_of(newest["messages"] + older)) == sorted(ids)
    ids += publish(http, queue, [f"{queue} after m{i}" for i in range(10)])
    asc = ids_of(every_page(http, queue, limit=13))
    assert sorted(asc) == sorted(ids) and len(set(asc)) == len(asc)
    assert ids_of(every_page(http, queue, limit=13, order="desc")) == asc[::-1]


def test_extents_deleted_between_pages_vanish_from_the_listing(http: httpx.Client) -> None:
    queue = unique("peek")
    assert http.put(f"/v1/queues/{queue}").status_code == 201
    old = fill(http, queue, rounds=1)
    first = page(http, queue, limit=10)
    assert ids_of(first["messages"]) == old[:10] and first["cursor"]
    assert http.delete(f"/v1/queues/{queue}", params={"contents_only": "true"}).status_code == 204
    new = publish(http, queue, [f"{queue} new m{i}" for i in range(5)])
    rest = ids_of(every_page(http, queue, cursor=first["cursor"], limit=4))
    assert rest == new  # nothing of the deleted extents, nothing twice
    assert ids_of(every_page(http, queue, limit=4, order="desc")) == new[::-1]


def test_large_messages_page_whole(http: httpx.Client) -> None:
    """A store read stops at 1 MiB: a page of larger messages takes several."""
    queue = unique("peek")
    assert http.put(f"/v1/queues/{queue}").status_code == 201
    ids = publish(http, queue, [f"{i:03d}" + "x" * 200_000 for i in range(12)])
    assert ids_of(every_page(http, queue, limit=10, order="desc")) == ids[::-1]
    assert ids_of(every_page(http, queue, limit=10)) == ids


def test_refusals(node: ServerProcess, http: httpx.Client) -> None:
    queue = unique("peek")
    assert http.put(f"/v1/queues/{queue}").status_code == 201
    publish(http, queue, ["one"])
    path = f"/v1/queues/{queue}/messages"
    with httpx.Client(base_url=node.url) as anonymous:
        assert anonymous.get(path).status_code == 401
        for key, status in ((PRODUCER, 403), (READER, 200)):
            answer = anonymous.get(path, headers={"Authorization": f"Bearer {key}"})
            assert answer.status_code == status, answer.text
    missing = http.get(f"/v1/queues/{unique('nope')}/messages")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "queue_not_found"
    for params in ({"limit": "0"}, {"limit": "1001"}, {"limit": "x"}, {"order": "up"},
                   {"since": "yesterday"}, {"until": "2026-13-01T00:00:00Z"},
                   {"since": "2026-01-01T00:00:00"}, {"cursor": "not a cursor"},
                   {"cursor": "eyJhIjoxfQ"}):  # fmt: skip
        answer = http.get(path, params=params)
        assert answer.status_code == 400, (params, answer.text)
        assert answer.json()["error"]["code"] == "invalid_request"
        assert list(params)[0] in answer.json()["error"]["message"]


async def test_the_async_client_peeks_a_page_and_every_page(
    node: ServerProcess, http: httpx.Client, filled: tuple[str, list[str]]
) -> None:
    queue, ids = filled
    every = page(http, queue, limit=1000)["messages"]
    async with AsyncClient(node.url, READER) as client:
        first = await client.peek(queue, limit=4, order="desc")
        assert first["messages"] == every[::-1][:4] and first["cursor"]
        since = datetime.fromisoformat(every[-1]["enqueued_at"].replace("Z", "+00:00"))
        assert (await client.peek(queue, since=since))["messages"] == [
            m for m in every if m["enqueued_at"] >= every[-1]["enqueued_at"]
        ]
        assert [m async for m in client.iter_peek(queue, page_size=9)] == every
        assert [m async for m in client.iter_peek(queue, order="desc", limit=12,
                                                  page_size=5)] == every[::-1][:12]  # fmt: skip
    async with AsyncClient(node.url, PRODUCER) as client:
        with pytest.raises(Forbidden):
            await client.peek(queue)


def test_the_sync_client_and_the_cli_peek(
    node: ServerProcess, http: httpx.Client, filled: tuple[str, list[str]]
) -> None:
    queue, ids = filled
    every = page(http, queue, limit=1000)["messages"]
    with Client(node.url, READER) as client:
        assert client.peek(queue, until=ms(every[5]["enqueued_at"]))["messages"] == [
            m for m in every if m["enqueued_at"] < every[5]["enqueued_at"]
        ]
        assert list(client.iter_peek(queue, page_size=50)) == every
    cli = [sys.executable, "-m", "cherami.cli.main", "peek", queue, "--url", node.url,
           "--api-key", READER]  # fmt: skip
    done = subprocess.run(cli + ["--limit", "7", "--desc", "--page-size", "3"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == every[::-1][:7]
    t = every[-1]["enqueued_at"]
    done = subprocess.run(cli + ["--since", t, "--limit", "1000"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert json.loads(done.stdout) == [m for m in every if m["enqueued_at"] >= t]
    done = subprocess.run(cli + ["--since", "yesterday"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode != 0 and "since must be" in done.stderr, done.stderr
