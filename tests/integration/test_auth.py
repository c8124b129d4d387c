"""A node started with API keys refuses requests without a valid key and scope."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess, keyed_node


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = keyed_node(tmp_path_factory.mktemp("secured"), [
        {"key": "admin-key", "scopes": ["admin"]},
        {"key": "prod-key", "scopes": ["produce"], "prefixes": ["orders"]},
        {"key": "cons-key", "scopes": ["consume"], "prefixes": ["orders"]},
    ], stores=1)  # fmt: skip
    yield proc
    proc.stop()


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_and_scopes(secured: ServerProcess) -> None:
    with httpx.Client(base_url=secured.url) as http:
        assert http.get("/healthz").status_code == 200
        assert http.put("/v1/queues/orders").json()["error"]["code"] == "unauthorized"
        assert http.put("/v1/queues/orders", headers=_h("wrong")).status_code == 401
        assert http.put("/v1/queues/orders", headers=_h("prod-key")).status_code == 403
        assert http.put("/v1/queues/orders", headers=_h("admin-key")).status_code == 201
        http.put("/v1/queues/orders/groups/g", headers=_h("admin-key"))
        http.put("/v1/queues/other", headers=_h("admin-key"))
        msg = {"messages": [{"body": "x"}]}
        assert (
            http.post("/v1/queues/orders/messages", json=msg, headers=_h("prod-key")).status_code
            == 200
        )
        denied = http.post("/v1/queues/other/messages", json=msg, headers=_h("prod-key"))
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
        assert (
            http.post("/v1/queues/orders/messages", json=msg, headers=_h("cons-key")).status_code
            == 403
        )
        recv = http.post(
            "/v1/queues/orders/groups/g/receive", json={"wait_seconds": 5}, headers=_h("cons-key")
        )
        assert recv.status_code == 200 and len(recv.json()["messages"]) == 1
        assert (
            http.post(
                "/v1/queues/orders/groups/g/receive", json={}, headers=_h("prod-key")
            ).status_code
            == 403
        )
        assert http.get("/v1/queues", headers=_h("cons-key")).status_code == 200
        assert http.get("/v1/queues/other", headers=_h("cons-key")).status_code == 403
        assert http.get("/v1/queues/orders", headers=_h("cons-key")).status_code == 200
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers=_h("cons-key")).status_code == 200


def test_remote_listen_without_keys_is_refused(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "node", stores=1)
    proc.extra = ["--host", "0.0.0.0"]
    with pytest.raises(RuntimeError, match="refusing to listen"):
        proc.start(timeout=20)


def test_the_console_and_api_explorer_pages_hold_no_data(secured: ServerProcess) -> None:
    """/ui and /docs answer without a key (static pages, as docs/api.md's table says);
    what they show comes from the API, which answers them only with a key."""
    with httpx.Client(base_url=secured.url) as http:
        http.put("/v1/queues/console-secret-q", headers=_h("admin-key"))
        for page in ("/ui/", "/docs"):
            resp = http.get(page)
            assert resp.status_code == 200, page
            assert "console-secret-q" not in resp.text
        assert http.get("/v1/queues").status_code == 401
        listed = http.get("/v1/queues", headers=_h("admin-key")).text
        assert "console-secret-q" in listed
