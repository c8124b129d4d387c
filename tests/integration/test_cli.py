"""The ``cherami`` command line, run as a subprocess against a real node."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from cherami import Client
from tests.support.blackhole import free_port
from tests.support.server import ServerProcess, unique


def cherami(
    server: ServerProcess | None, *args: str, stdin: str | None = None, url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_")}
    if server is not None:
        env["CHERAMI_URL"] = server.url
    command = [sys.executable, "-m", "cherami.cli.main", *args]
    if url is not None:
        command += ["--url", url]
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=60, env=env, check=False
    )


def ok(server: ServerProcess, *args: str, stdin: str | None = None) -> str:
    result = cherami(server, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def ok_json(server: ServerProcess, *args: str) -> Any:
    return json.loads(ok(server, *args))


def assert_one_line_error(result: subprocess.CompletedProcess[str], starts: str) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), result.stderr


def test_queue_create_list_show_delete(server: ServerProcess) -> None:
    queue = unique("q")
    created = ok_json(
        server, "queue", "create", queue, "--replicas", "2", "--min-extents", "2",
        "--delay-seconds", "0", "--retention-seconds", "3600", "--max-message-bytes", "2048",
        "--type", "ap",
    )  # fmt: skip
    assert created["name"] == queue
    assert (created["replicas"], created["min_extents"]) == (2, 2)
    assert (created["retention_seconds"], created["max_message_bytes"]) == (3600, 2048)
    assert queue in [q["name"] for q in ok_json(server, "queue", "list")]

    ok(server, "publish", queue, "a", "b")
    shown = ok_json(server, "queue", "show", queue)
    assert shown["name"] == queue and shown["stats"]["messages_published"] == 2

    assert ok(server, "queue", "delete", queue, "--contents-only") == ""
    assert ok_json(server, "queue", "show", queue)["name"] == queue
    assert ok(server, "queue", "delete", queue) == ""
    assert queue not in [q["name"] for q in ok_json(server, "queue", "list")]
    assert_one_line_error(cherami(server, "queue", "show", queue), "error: queue_not_found")


def test_group_create_list_show_delete(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    ok(server, "queue", "create", queue)
    created = ok_json(
        server, "group", "create", queue, group, "--visibility-timeout", "5",
        "--max-delivery-count", "3", "--start-from", "earliest", "--delay-seconds", "0",
        "--type", "competing",
    )  # fmt: skip
    assert (created["visibility_timeout_seconds"], created["max_delivery_count"]) == (5, 3)
    assert [g["name"] for g in ok_json(server, "group", "list", queue)] == [group]
    shown = ok_json(server, "group", "show", queue, group)
    assert shown["stats"]["backlog"] == 0 and shown["type"] == "competing"
    assert ok(server, "group", "delete", queue, group) == ""
    assert_one_line_error(cherami(server, "group", "show", queue, group), "error: group_not_found")


def test_publish_from_arguments_and_stdin_then_consume_with_ack(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    ok(server, "queue", "create", queue)
    ok(server, "group", "create", queue, group)

    ids = ok(server, "publish", queue, "first", "second", "--attr", "k=v=w", "--attr", "x=1")
    assert len(set(ids.split())) == 2
    lines = "".join(f"line {i}\n" for i in range(200))
    assert ok(server, "publish", queue, stdin=lines).strip() == "published 200 messages"

    out = ok(server, "consume", queue, group, "--max", "500", "--wait", "1", "--ack")
    messages = [json.loads(line) for line in out.splitlines()]
    assert len(messages) == 202
    assert sorted(m["body"] for m in messages) == sorted(
        ["first", "second", *(f"line {i}" for i in range(200))]
    )
    first = next(m for m in messages if m["body"] == "first")
    assert first["attributes"] == {"k": "v=w", "x": "1"}
    assert first["delivery_count"] == 1 and first["id"] in ids.split()
    stats = ok_json(server, "group", "show", queue, group)["stats"]
    assert (stats["backlog"], stats["in_flight"], stats["acked"]) == (0, 0, 202)


def test_consume_without_ack_leaves_messages_in_flight(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    ok(server, "queue", "create", queue)
    ok(server, "group", "create", queue, group, "--visibility-timeout", "30")
    ok(server, "publish", queue, "one", "two", "three")
    out = ok(server, "consume", queue, group, "--max", "2", "--wait", "2")
    assert len(out.splitlines()) == 2
    stats = ok_json(server, "group", "show", queue, group)["stats"]
    assert (stats["backlog"], stats["in_flight"]) == (3, 2)


def dead_letter(c: Client, queue: str, group: str) -> None:
    """Receive the one message and nack it: with max_delivery_count 1 it goes to the DLQ."""
    (message,) = c.receive(queue, group, wait_seconds=5)
    assert message.text == "poison"
    c.nack(queue, group, [message.receipt or ""])
    deadline = time.monotonic() + 5
    while c.dlq(queue, group)["depth"] != 1:
        assert time.monotonic() < deadline, "the message never reached the DLQ"
        time.sleep(0.05)


def test_dlq_show_merge_purge(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    ok(server, "queue", "create", queue)
    ok(server, "group", "create", queue, group, "--max-delivery-count", "1")
    with Client(server.url) as c:
        c.publish(queue, ["poison"])
        dead_letter(c, queue, group)
        shown = ok_json(server, "dlq", "show", queue, group, "--limit", "10")
        assert shown["depth"] == 1 and [m["body"] for m in shown["messages"]] == ["poison"]
        assert ok_json(server, "dlq", "merge", queue, group) == {"merged": 1}
        dead_letter(c, queue, group)
    assert ok_json(server, "dlq", "purge", queue, group) == {"purged": 1}
    assert ok_json(server, "dlq", "show", queue, group) == {"messages": [], "depth": 0}


def test_unknown_queue_is_a_one_line_error(server: ServerProcess) -> None:
    missing = unique("missing")
    assert_one_line_error(cherami(server, "queue", "show", missing), "error: queue_not_found")
    assert_one_line_error(cherami(server, "publish", missing, "x"), "error: queue_not_found")
    assert_one_line_error(
        cherami(server, "publish", missing, stdin="a\nb\n"),
        f"error: queue_not_found: no queue {missing}",
    )
    assert_one_line_error(cherami(server, "consume", missing, "g"), "error: queue_not_found")


def test_bad_attribute_is_a_usage_error(server: ServerProcess) -> None:
    result = cherami(server, "publish", "q", "body", "--attr", "novalue")
    assert result.returncode == 2
    assert "key=value" in result.stderr and "Traceback" not in result.stderr


def test_connection_refused_is_a_one_line_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    assert_one_line_error(cherami(None, "queue", "list", url=url), "error: unavailable")
    assert_one_line_error(cherami(None, "publish", "q", stdin="a\n", url=url), "error: unavailable")


def test_bulk_publish_reports_a_refused_batch_instead_of_a_partial_count(
    server: ServerProcess,
) -> None:
    queue = unique("q")
    ok(server, "queue", "create", queue, "--max-message-bytes", "100")
    lines = "".join(("x" * 200 if i == 250 else f"line {i}") + "\n" for i in range(1000))
    result = cherami(server, "publish", queue, "--batch-size", "100", stdin=lines)
    assert_one_line_error(result, "error: message_too_large: ")
    assert "published 900 messages; not that batch" in result.stderr
    stats = ok_json(server, "queue", "show", queue)["stats"]
    assert stats["messages_published"] == 900


def test_url_works_before_the_command_too(server: ServerProcess) -> None:
    """``cherami --url U queue list`` once said "no such option": --url (and --api-key,
    --tls-ca) went only after the command. Both places work, and a flag beats
    CHERAMI_URL wherever it is given."""
    q = unique("q")
    created = cherami(None, "--url", server.url, "queue", "create", q)
    assert created.returncode == 0, created.stderr
    env_elsewhere = dict(os.environ, CHERAMI_URL="http://127.0.0.1:9")  # nothing listens
    listed = subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", "--url", server.url, "queue", "list"],
        capture_output=True, text=True, timeout=60, env=env_elsewhere, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert q in listed.stdout
    bad = cherami(None, "--url", "ftp://x", "queue", "list")
    assert bad.returncode == 2 and "must start with http:// or https://" in bad.stderr


def test_publish_with_an_ordering_key(server: ServerProcess) -> None:
    queue = unique("q")
    ok(server, "queue", "create", queue)
    ok(server, "publish", queue, "created", "paid", "--key", "order-17")
    assert ok(server, "publish", queue, "--key", "order-18", stdin="a\nb\n").strip() == (
        "published 2 messages"
    )
    with Client(server.url) as c:
        page = c.peek(queue)
    assert [(m["body"], m.get("key")) for m in page["messages"]] == [
        ("created", "order-17"), ("paid", "order-17"), ("a", "order-18"), ("b", "order-18")
    ]  # fmt: skip
    bad = cherami(server, "publish", queue, "x", "--key", "x" * 129)
    assert bad.returncode == 1 and "key" in bad.stderr, bad.stderr


def test_consuming_a_stream_mode_group_is_a_one_line_error(server: ServerProcess) -> None:
    """A stream-mode group is read by offsets (the Spark source): ``cherami consume`` of
    one printed nothing and exited 0, as if the group were empty, though it held a
    message. It says why, on one line, and exits 1."""
    queue, group = unique("q"), unique("g")
    ok(server, "queue", "create", queue)
    ok(server, "group", "create", queue, group, "--type", "stream")
    ok(server, "publish", queue, "x")
    result = cherami(server, "consume", queue, group, "--wait", "1")
    assert_one_line_error(
        result,
        f"error: invalid_request: group {group} is a stream-mode group: it is read by "
        "offsets (the Spark source, docs/spark.md), not by receive or a consume stream",
    )
    assert result.returncode == 1


def test_publish_to_a_wrong_url_fails_within_seconds_saying_why() -> None:
    """``cherami --url WRONG publish QUEUE BODY`` waited 30 s in silence (its publish
    retried as if a known server were restarting). A host name that does not resolve is
    a usage error (exit 2) that says to check the URL; a port nobody listens on is
    ``unavailable`` (exit 5), after the 2 s an idempotent call gets. The same from stdin,
    which streams."""
    refused = f"http://127.0.0.1:{free_port()}"
    cases = [
        ("http://no-such-host.invalid:8080", 2,
         "error: invalid_config: http://no-such-host.invalid:8080: cannot resolve the host "
         "(check the URL): "),
        (refused, 5, f"error: unavailable: {refused}: Cannot connect to host"),
    ]  # fmt: skip
    for url, code, says in cases:
        for body, stdin in ((("hello",), None), ((), "hello\n")):
            started = time.monotonic()
            result = cherami(None, "--url", url, "publish", "orders", *body, stdin=stdin)
            assert time.monotonic() - started < 10, (url, body, "too slow")
            assert_one_line_error(result, says)
            assert result.returncode == code, (url, body, result.stderr)
