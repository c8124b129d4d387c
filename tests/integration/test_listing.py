"""Listing queues and groups a page at a time (issue 29) over real HTTP, the Python
clients and the CLI, against a node of this module's own holding 250 queues (so the
other tests' node keeps a short listing)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.inprocess import InProcessNode

QUEUES = [f"page-{i:03d}" for i in range(250)]
OTHERS = ["other-a", "other-b"]
GROUPS = ["g-1", "g-2", "g-3", "g_4", "h-1"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessNode]:
    """The listing is the frontend's and the metadata's logic: its node's store host is
    the in-process double (tests/support/inprocess.py)."""
    proc = InProcessNode(tmp_path_factory.mktemp("listing"), stores=1).start()
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        for name in QUEUES + OTHERS:
            assert http.put(f"/v1/queues/{name}").status_code == 201
        for group in GROUPS:  # each with its DLQ: internal queues no listing shows
            assert http.put(f"/v1/queues/other-a/groups/{group}").status_code == 201
    yield proc
    proc.stop()


@pytest.fixture
def http(node: InProcessNode) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=node.url, timeout=30) as c:
        yield c


def _pages(http: httpx.Client, path: str, key: str, **params: Any) -> list[list[str]]:
    """Every page's names, each asked for with the cursor of the one before."""
    pages: list[list[str]] = []
    cursor = None
    while True:
        answer = http.get(path, params={**params, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body) == {key, "cursor"}
        pages.append([item["name"] for item in body[key]])
        cursor = body["cursor"]
        if cursor is None:
            return pages


def _error(resp: httpx.Response) -> str:
    assert resp.status_code == 400, resp.text
    return str(resp.json()["error"]["code"])


def test_250_queues_in_pages_of_100(http: httpx.Client) -> None:
    pages = _pages(http, "/v1/queues", "queues", limit=100)
    assert [len(page) for page in pages] == [100, 100, 52]
    names = [name for page in pages for name in page]
    assert names == sorted(QUEUES + OTHERS)  # each once, in order; no DLQ
    # without a limit: 100 a page, the same pages
    assert _pages(http, "/v1/queues", "queues") == pages
    assert _pages(http, "/v1/queues", "queues", limit=1000) == [names]
    shown = http.get("/v1/queues/other-a").json()
    del shown["stats"]  # a listed queue is its record without the stats
    assert http.get("/v1/queues", params={"limit": 1}).json()["queues"] == [shown]


def test_a_prefix_filters_and_pages(http: httpx.Client) -> None:
    pages = _pages(http, "/v1/queues", "queues", prefix="page-1", limit=40)
    assert [len(page) for page in pages] == [40, 40, 20]
    assert [n for page in pages for n in page] == [n for n in QUEUES if n.startswith("page-1")]
    assert _pages(http, "/v1/queues", "queues", prefix="page-24") == [
        [f"page-24{i}" for i in range(10)]
    ]
    assert _pages(http, "/v1/queues", "queues", prefix="other") == [OTHERS]
    assert _pages(http, "/v1/queues", "queues", prefix="nothing") == [[]]
    assert _pages(http, "/v1/queues", "queues", prefix="_") == [[]]  # DLQs stay hidden
    exact = http.get("/v1/queues", params={"prefix": "page-249", "limit": 1}).json()
    assert [q["name"] for q in exact["queues"]] == ["page-249"] and exact["cursor"] is None


def test_groups_page_and_filter(http: httpx.Client) -> None:
    path = "/v1/queues/other-a/groups"
    assert _pages(http, path, "groups", limit=2) == [["g-1", "g-2"], ["g-3", "g_4"], ["h-1"]]
    assert _pages(http, path, "groups", prefix="g_") == [["g_4"]]
    assert _pages(http, path, "groups", prefix="g", limit=3) == [["g-1", "g-2", "g-3"], ["g_4"]]
    assert _pages(http, "/v1/queues/other-b/groups", "groups") == [[]]
    missing = http.get("/v1/queues/nope/groups", params={"limit": 5})
    assert missing.status_code == 404
    assert http.get("/v1/queues/other-a/groups", params={"limit": 0}).status_code == 400


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"}, {"limit": "1001"}, {"limit": "-1"}, {"limit": "ten"}, {"limit": ""},
        {"limit": "1.5"}, {"limit": " 5"}, {"cursor": "*"}, {"cursor": "abcde"},
        {"cursor": "a" * 176}, {"cursor": "YQ=="}, {"prefix": "a b"}, {"prefix": "x" * 129},
        {"prefix": "é"},
    ],
)  # fmt: skip
def test_a_bad_limit_cursor_or_prefix_is_refused(
    http: httpx.Client, params: dict[str, str]
) -> None:
    for path in ("/v1/queues", "/v1/queues/other-a/groups"):
        assert _error(http.get(path, params=params)) == "invalid_request"


def test_any_well_formed_cursor_is_a_place_in_the_listing(http: httpx.Client) -> None:
    """A cursor not made here still lists each name above its place once, in order."""

    def after(raw: bytes) -> list[str]:
        cursor = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        answer = http.get("/v1/queues", params={"cursor": cursor, "limit": 1000}).json()
        return [q["name"] for q in answer["queues"]]

    everything = sorted(QUEUES + OTHERS)
    assert after(b"page-199") == everything[everything.index("page-199") + 1 :]
    assert after(b"page-1\x00") == [n for n in everything if n > "page-1"]
    assert after(b"page-1\xff\xfe") == [n for n in everything if n >= "page-2"]
    assert after(b"page-1 x") == [n for n in everything if n > "page-1"]
    assert after(b"\x00") == everything and after(b"\xff") == []
    assert http.get("/v1/queues", params={"cursor": ""}).json()["queues"][0]["name"] == "other-a"


def test_clients_page_through_everything(node: InProcessNode) -> None:
    from cherami import Client

    with Client(node.url) as client:
        assert [q["name"] for q in client.list_queues()] == sorted(QUEUES + OTHERS)
        assert [q["name"] for q in client.list_queues(prefix="page-2", limit=3)] == [
            "page-200", "page-201", "page-202"
        ]  # fmt: skip
        pages = list(client.iter_queues(prefix="page-1", page_size=30))
        assert [q["name"] for q in pages] == [n for n in QUEUES if n.startswith("page-1")]
        assert [g["name"] for g in client.list_groups("other-a", prefix="g-")] == GROUPS[:3]
        assert [g["name"] for g in client.iter_groups("other-a", page_size=2)] == GROUPS


async def test_the_async_client_pages_as_it_goes(node: InProcessNode) -> None:
    from cherami import AsyncClient

    async with AsyncClient(node.url) as client:
        names = [q["name"] async for q in client.iter_queues(page_size=100)]
        assert names == sorted(QUEUES + OTHERS)
        assert len(await client.list_queues(limit=120)) == 120
        groups = [g["name"] async for g in client.iter_groups("other-a", prefix="g", page_size=1)]
        assert groups == GROUPS[:4]


def _cli(node: InProcessNode, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_")}
    env["CHERAMI_URL"] = node.url
    return subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", *args], capture_output=True, text=True,
        timeout=60, env=env, check=False,
    )  # fmt: skip


def test_cli_lists_every_page_and_filters(node: InProcessNode) -> None:
    listed = _cli(node, "queue", "list")
    assert listed.returncode == 0, listed.stderr
    assert [q["name"] for q in json.loads(listed.stdout)] == sorted(QUEUES + OTHERS)
    some = _cli(node, "queue", "list", "--prefix", "page-0", "--limit", "12", "--page-size", "5")
    assert some.returncode == 0, some.stderr
    assert [q["name"] for q in json.loads(some.stdout)] == QUEUES[:12]
    table = _cli(node, "-o", "table", "queue", "list", "--prefix", "page-1", "--page-size", "30")
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if "page-1" in line]
    assert [row.split()[1] for row in rows] == [n for n in QUEUES if n.startswith("page-1")]
    assert table.stdout.count("NAME") == 1  # one header for all the pages
    groups = _cli(node, "group", "list", "other-a", "--prefix", "g")
    assert [g["name"] for g in json.loads(groups.stdout)] == GROUPS[:4]
    none = _cli(node, "queue", "list", "--prefix", "zzz")
    assert none.returncode == 0 and json.loads(none.stdout) == []
    bad = _cli(node, "queue", "list", "--prefix", "a b")
    assert bad.returncode == 1 and bad.stderr.startswith("error: invalid_request"), bad.stderr
