"""Queue and group administration, health, metrics, OpenAPI and error codes over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from tests.support.server import ServerProcess, unique


@pytest.fixture
def http(server: ServerProcess) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _code(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["code"])


def test_health_metrics_openapi(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    q = unique()
    http.put(f"/v1/queues/{q}")
    http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]})
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert f'cherami_messages_published_total{{queue="{q}"}} 1.0' in metrics.text
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert "post" in doc["paths"]["/v1/queues/{queue}/groups/{group}/receive"]
    assert "ReceiveRequest" in doc["components"]["schemas"]


def test_queue_create_is_idempotent_and_conflicts(http: httpx.Client) -> None:
    q = unique()
    created = http.put(f"/v1/queues/{q}", json={"type": "cp", "min_extents": 2})
    assert created.status_code == 201
    assert created.json()["type"] == "cp" and created.json()["replicas"] == 3
    assert http.put(f"/v1/queues/{q}", json={"type": "cp", "min_extents": 2}).status_code == 200
    conflict = http.put(f"/v1/queues/{q}", json={"type": "ap"})
    assert conflict.status_code == 409 and _code(conflict) == "already_exists"
    shown = http.get(f"/v1/queues/{q}").json()
    assert shown["stats"] == {
        "messages_published": 0, "open_extents": 2, "sealed_extents": 0, "bytes_stored": 0,
        "unconsumed_bytes": 0,
    }  # fmt: skip
    listed = http.get("/v1/queues", params={"prefix": q}).json()
    assert [x["name"] for x in listed["queues"]] == [q] and listed["cursor"] is None
    assert not any(x["name"].startswith("_") for x in http.get("/v1/queues").json()["queues"])


def test_queue_patch_and_delete(http: httpx.Client) -> None:
    q = unique()
    http.put(f"/v1/queues/{q}")
    patched = http.patch(f"/v1/queues/{q}", json={"retention_seconds": 3600, "min_extents": 2})
    assert patched.status_code == 200 and patched.json()["retention_seconds"] == 3600
    assert http.get(f"/v1/queues/{q}").json()["stats"]["open_extents"] == 2  # 2 plain, no timer
    bad = http.patch(f"/v1/queues/{q}", json={"type": "cp"})
    assert bad.status_code == 400 and _code(bad) == "invalid_request"
    assert http.delete(f"/v1/queues/{q}").status_code == 204
    gone = http.get(f"/v1/queues/{q}")
    assert gone.status_code == 404 and _code(gone) == "queue_not_found"


def test_delete_contents_only_keeps_queue_and_groups(http: httpx.Client) -> None:
    q = unique()
    http.put(f"/v1/queues/{q}")
    http.put(f"/v1/queues/{q}/groups/g")
    http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "a"}, {"body": "b"}]})
    assert http.delete(f"/v1/queues/{q}", params={"contents_only": "true"}).status_code == 204
    assert http.get(f"/v1/queues/{q}").status_code == 200
    group = http.get(f"/v1/queues/{q}/groups/g").json()
    assert group["stats"]["backlog"] == 0
    got = http.post(f"/v1/queues/{q}/groups/g/receive", json={"wait_seconds": 0.5}).json()
    assert got["messages"] == []
    http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "c"}]})
    got = http.post(f"/v1/queues/{q}/groups/g/receive", json={"wait_seconds": 5}).json()
    assert [m["body"] for m in got["messages"]] == ["c"]


def test_group_lifecycle(http: httpx.Client) -> None:
    q = unique()
    http.put(f"/v1/queues/{q}")
    made = http.put(
        f"/v1/queues/{q}/groups/g1", json={"visibility_timeout_seconds": 5, "max_delivery_count": 3}
    )
    assert made.status_code == 201
    assert (
        http.put(
            f"/v1/queues/{q}/groups/g1",
            json={"visibility_timeout_seconds": 5, "max_delivery_count": 3},
        ).status_code
        == 200
    )
    conflict = http.put(f"/v1/queues/{q}/groups/g1", json={"max_delivery_count": 4})
    assert conflict.status_code == 409 and _code(conflict) == "already_exists"
    assert [g["name"] for g in http.get(f"/v1/queues/{q}/groups").json()["groups"]] == ["g1"]
    shown = http.get(f"/v1/queues/{q}/groups/g1").json()
    assert set(shown["stats"]) == {
        "backlog", "in_flight", "dlq_depth", "oldest_unacked_age_seconds",
        "delivered", "acked", "redelivered", "top_keys", "expired", "cancelled",
    }  # fmt: skip
    patched = http.patch(f"/v1/queues/{q}/groups/g1", json={"max_delivery_count": 7})
    assert patched.json()["max_delivery_count"] == 7
    assert http.delete(f"/v1/queues/{q}/groups/g1").status_code == 204
    missing = http.get(f"/v1/queues/{q}/groups/g1")
    assert missing.status_code == 404 and _code(missing) == "group_not_found"


@pytest.mark.parametrize(
    "name", ["-bad", "has space", "a" * 129, "semi;colon", "_internal", "orders%0A", "a%0D"]
)
def test_invalid_names(http: httpx.Client, name: str) -> None:
    resp = http.put(f"/v1/queues/{name}")  # %0A: a trailing newline once made "orders\n"
    assert resp.status_code == 400 and _code(resp) == "invalid_name"
    assert http.get(f"/v1/queues/{name}").status_code in (400, 404)


def test_invalid_requests_are_400_never_500(http: httpx.Client) -> None:
    q = unique()
    http.put(f"/v1/queues/{q}")
    http.put(f"/v1/queues/{q}/groups/g")
    cases = [
        ("PUT", f"/v1/queues/{unique()}", b"{not json"),
        ("PUT", f"/v1/queues/{unique()}", b'{"replicas": "three"}'),
        ("PUT", f"/v1/queues/{unique()}", b'{"replicas": 0}'),
        ("PUT", f"/v1/queues/{unique()}", b'{"replicas": 9}'),
        ("PUT", f"/v1/queues/{unique()}", b'{"type": "xp"}'),
        ("PUT", f"/v1/queues/{unique()}", b'{"unknown_field": 1}'),
        ("PUT", f"/v1/queues/{q}/groups/{unique()}", b'{"start_from": "yesterday"}'),
        ("PUT", f"/v1/queues/{q}/groups/{unique()}", b'{"visibility_timeout_seconds": -1}'),
        ("POST", f"/v1/queues/{q}/messages", b"[]"),
        ("POST", f"/v1/queues/{q}/messages", b'{"messages": []}'),
        ("POST", f"/v1/queues/{q}/messages", b""),
        ("POST", f"/v1/queues/{q}/messages", b'{"messages": [{"body": "a", "body_b64": "YQ=="}]}'),
        ("POST", f"/v1/queues/{q}/messages", b'{"messages": [{}]}'),
        ("POST", f"/v1/queues/{q}/messages", b'{"messages": [{"body_b64": "***"}]}'),
        (
            "POST",
            f"/v1/queues/{q}/messages",
            b'{"messages": [{"body": "a", "attributes": {"k": 1}}]}',
        ),
        ("POST", f"/v1/queues/{q}/messages", b'{"messages": [{"body": 5}]}'),
        ("POST", f"/v1/queues/{q}/groups/g/receive", b'{"max_messages": 0}'),
        ("POST", f"/v1/queues/{q}/groups/g/receive", b'{"max_messages": 1001}'),
        ("POST", f"/v1/queues/{q}/groups/g/receive", b'{"wait_seconds": 21}'),
        ("POST", f"/v1/queues/{q}/groups/g/ack", b'{"receipts": "abc"}'),
        ("POST", f"/v1/queues/{q}/groups/g/ack", b"{}"),
        ("POST", f"/v1/queues/{q}/groups/g/nack", b'{"receipts": ["x"], "delay_seconds": -2}'),
        ("POST", f"/v1/queues/{q}/groups/g/visibility", b'{"receipts": ["x"]}'),
        ("GET", f"/v1/queues/{q}/groups/g/dlq?limit=abc", b""),
        ("GET", f"/v1/queues/{q}/groups/g/dlq?limit=0", b""),
    ]
    for method, path, body in cases:
        resp = http.request(method, path, content=body)
        assert resp.status_code == 400, (method, path, body, resp.text)
        assert _code(resp) == "invalid_request", (path, body, resp.text)
    many = {"messages": [{"body": "x"}] * 1001}
    assert http.post(f"/v1/queues/{q}/messages", json=many).status_code == 400
    # bad base64 anywhere in a batch fails all of it and names the message
    for bad in ["YQ", "Y Q==", "YQ==\n", "***"]:
        batch = {"messages": [{"body_b64": "YQ=="}, {"body": "b"}, {"body_b64": bad}]}
        resp = http.post(f"/v1/queues/{q}/messages", json=batch)
        assert resp.status_code == 400 and _code(resp) == "invalid_request", bad
        assert "$.messages[2].body_b64" in resp.json()["error"]["message"], resp.text
    assert http.get(f"/v1/queues/{q}").json()["stats"]["messages_published"] == 0


def test_unknown_queue_and_group_are_404(http: httpx.Client) -> None:
    q = unique()
    for method, path in [
        ("GET", f"/v1/queues/{q}"),
        ("POST", f"/v1/queues/{q}/messages"),
        ("DELETE", f"/v1/queues/{q}"),
        ("PUT", f"/v1/queues/{q}/groups/g"),
        ("GET", f"/v1/queues/{q}/groups"),
    ]:
        resp = http.request(method, path, json={"messages": [{"body": "x"}]})
        assert resp.status_code == 404 and _code(resp) == "queue_not_found", (method, path)
    http.put(f"/v1/queues/{q}")
    for path in ["receive", "ack", "nack", "dlq/merge", "dlq/purge"]:
        resp = http.post(f"/v1/queues/{q}/groups/nope/{path}", json={"receipts": ["x"]})
        assert resp.status_code == 404 and _code(resp) == "group_not_found", path
    assert http.get("/v2/nothing").status_code == 404


def test_replicas_beyond_store_hosts_is_refused(http: httpx.Client) -> None:
    resp = http.put(f"/v1/queues/{unique()}", json={"replicas": 5})
    assert resp.status_code == 400 and _code(resp) == "invalid_request"
