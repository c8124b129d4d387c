"""``cherami --output table`` prints tables, JSON stays the default, and the exit code
says what went wrong: 3 not found, 4 conflict, 5 unavailable, 6 no access."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.support.server import ServerProcess, unique


def cherami(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_")}
    env["CHERAMI_URL"] = url
    return subprocess.run([sys.executable, "-m", "cherami.cli.main", *args],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def test_tables_and_exit_codes(server: ServerProcess) -> None:
    q = unique()
    created = cherami(server.url, "queue", "create", q, "--retention-seconds", "3600")
    assert created.returncode == 0 and json.loads(created.stdout)["name"] == q
    cherami(server.url, "group", "create", q, "billing")
    cherami(server.url, "publish", q, "a", "b")

    shown = cherami(server.url, "--output", "table", "queue", "show", q)
    assert shown.returncode == 0, shown.stderr
    assert "FIELD" in shown.stdout and "stats.messages_published" in shown.stdout
    assert any("retention_seconds" in line and "3,600" in line
               for line in shown.stdout.splitlines())  # fmt: skip
    listed = cherami(server.url, "-o", "table", "group", "list", q)
    assert listed.returncode == 0 and "MAX_DELIVERY_COUNT" in listed.stdout
    assert "billing" in listed.stdout
    with_env = subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", "group", "show", q, "billing"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "CHERAMI_URL": server.url, "CHERAMI_OUTPUT": "table"},
    )  # fmt: skip
    assert "stats.backlog" in with_env.stdout and "2" in with_env.stdout
    assert json.loads(cherami(server.url, "queue", "show", q).stdout)["name"] == q  # default

    missing = cherami(server.url, "queue", "show", unique("missing"))
    assert missing.returncode == 3 and missing.stderr.startswith("error: queue_not_found")
    conflict = cherami(server.url, "queue", "create", q, "--retention-seconds", "60")
    assert conflict.returncode == 4 and conflict.stderr.startswith("error: already_exists")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = cherami(f"http://127.0.0.1:{port}", "queue", "list")
    assert down.returncode == 5 and down.stderr.startswith("error: unavailable")
    usage = cherami(server.url, "--output", "yaml", "queue", "list")
    assert usage.returncode == 2 and "yaml" in usage.stderr


def test_update_commands(server: ServerProcess) -> None:
    q = unique()
    cherami(server.url, "queue", "create", q)
    cherami(server.url, "group", "create", q, "billing")
    updated = cherami(server.url, "queue", "update", q, "--retention-seconds", "7200")
    assert updated.returncode == 0, updated.stderr
    assert json.loads(updated.stdout)["retention_seconds"] == 7200
    group = cherami(server.url, "group", "update", q, "billing", "--visibility-timeout", "5",
                    "--max-delivery-count", "3")  # fmt: skip
    assert group.returncode == 0, group.stderr
    assert (json.loads(group.stdout)["visibility_timeout_seconds"],
            json.loads(group.stdout)["max_delivery_count"]) == (5, 3)  # fmt: skip
    nothing = cherami(server.url, "queue", "update", q)
    assert nothing.returncode == 2 and "at least one setting" in nothing.stderr
    bad = cherami(server.url, "group", "update", q, "billing", "--visibility-timeout", "0")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: invalid_request:") and "--visibility-timeout" in bad.stderr


def test_consume_prints_receipts_for_ack_and_nack(server: ServerProcess) -> None:
    q, g = unique(), "workers"
    cherami(server.url, "queue", "create", q)
    cherami(server.url, "group", "create", q, g, "--visibility-timeout", "60")
    cherami(server.url, "publish", q, "one", "two", "three")
    out = cherami(server.url, "consume", q, g, "--max", "3", "--wait", "2").stdout
    receipts = [json.loads(line)["receipt"] for line in out.splitlines()]
    assert len(receipts) == 3
    acked = cherami(server.url, "ack", q, g, receipts[0], receipts[1])
    assert acked.returncode == 0 and json.loads(acked.stdout) == {"acked": 2, "stale": []}
    nacked = subprocess.run(  # receipts one a line on stdin
        [sys.executable, "-m", "cherami.cli.main", "nack", q, g, "--delay-seconds", "0"],
        input=receipts[2] + "\n", capture_output=True, text=True, timeout=60,
        env={**os.environ, "CHERAMI_URL": server.url},
    )  # fmt: skip
    assert nacked.returncode == 0 and json.loads(nacked.stdout)["nacked"] == 1
    again = cherami(server.url, "ack", q, g, receipts[0])  # already acked: stale
    assert json.loads(again.stdout) == {"acked": 0, "stale": [receipts[0]]}
    redelivered = cherami(server.url, "consume", q, g, "--max", "1", "--wait", "5", "--ack")
    message = json.loads(redelivered.stdout)
    assert (message["body"], message["delivery_count"]) == ("three", 2)
