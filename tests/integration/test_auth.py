"""A node started with API keys refuses requests without a valid key and scope."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess, keyed_node, unique


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


def _cli(*args: str, env_key: str | None = None) -> subprocess.CompletedProcess[str]:
    """``cherami ARGS`` with no CHERAMI_* variable but CHERAMI_API_KEY=``env_key``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_")}
    if env_key is not None:
        env["CHERAMI_API_KEY"] = env_key
    return subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def test_the_cli_takes_api_key_before_the_command_too(secured: ServerProcess) -> None:
    """``cherami --api-key K queue create Q`` sends K, as ``--url`` before the command
    sends to that URL; given there, it beats CHERAMI_API_KEY, and the command's own
    --api-key beats it. Each key's answer differs (none 401, prod-key 403, admin-key
    201), so each run shows which key was sent."""
    url, q = secured.url, unique("orders")
    no_key = _cli("--url", url, "queue", "create", q)
    assert no_key.returncode == 6 and "error: unauthorized" in no_key.stderr, no_key.stderr
    producer = _cli("--url", url, "--api-key", "prod-key", "queue", "create", q)
    assert producer.returncode == 6 and "error: forbidden" in producer.stderr, producer.stderr
    admin = _cli("--url", url, "--api-key", "admin-key", "queue", "create", q, env_key="wrong")
    assert admin.returncode == 0, admin.stderr
    own = _cli("--api-key", "wrong", "queue", "show", q, "--url", url, "--api-key", "admin-key")
    assert own.returncode == 0 and q in own.stdout, own.stderr
