"""Keys stored hashed in the auth file, plain keys still read (with a warning), and the
file read again on SIGHUP without a restart: a bad file keeps the keys in use."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cherami.roles.frontend.auth import hash_key
from tests.support.server import ServerProcess, unique

ADMIN = "admin-plain-key"
HASHED = "chk_hashed-producer-key"
ADDED = "chk_added-after-start"


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _entries(*extra: dict[str, object]) -> list[dict[str, object]]:
    return [
        {"key": ADMIN, "scopes": ["admin"]},  # in clear: read, with a warning
        {"key_sha256": hash_key(HASHED).hex(), "scopes": ["produce"]},
        *extra,
    ]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("reload")
    keys = root / "keys.json"
    keys.write_text(json.dumps(_entries()))
    proc = ServerProcess(root / "node", stores=1, extra=["--auth-file", str(keys)]).start()
    yield proc, keys
    assert proc.stop() == 0


def _sighup(proc: ServerProcess, log_line: str) -> None:
    """SIGHUP the server and wait for the log line that says what the reload did."""
    assert proc.proc is not None
    seen = len([line for line in proc.output if log_line in line])
    proc.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while len([line for line in proc.output if log_line in line]) == seen:
        assert time.monotonic() < deadline, "no reload line:\n" + "\n".join(proc.output)
        time.sleep(0.02)


def _publish(http: httpx.Client, queue: str, key: str) -> int:
    reply = http.post(f"/v1/queues/{queue}/messages", json={"messages": [{"body": "x"}]},
                      headers=_h(key))  # fmt: skip
    return reply.status_code


def test_hashed_and_plain_keys(node: tuple[ServerProcess, Path]) -> None:
    proc, _ = node
    q = unique()
    with httpx.Client(base_url=proc.url) as http:
        assert http.put(f"/v1/queues/{q}", headers=_h(ADMIN)).status_code == 201  # plain
        assert _publish(http, q, HASHED) == 200  # stored as its SHA-256 only
        assert _publish(http, q, hash_key(HASHED).hex()) == 401  # the hash is no key
        assert _publish(http, q, HASHED + "x") == 401
    assert any("1 key(s) in clear" in line for line in proc.output), "no plain-key warning"


def test_sighup_adds_and_removes_keys_and_keeps_them_on_a_bad_file(
    node: tuple[ServerProcess, Path],
) -> None:
    proc, keys = node
    q = unique()
    with httpx.Client(base_url=proc.url) as http:
        assert http.put(f"/v1/queues/{q}", headers=_h(ADMIN)).status_code == 201
        assert _publish(http, q, ADDED) == 401
        # a key added to the file is let in after SIGHUP, without a restart
        added = {"key_sha256": hash_key(ADDED).hex(), "scopes": ["produce"]}
        keys.write_text(json.dumps(_entries(added)))
        _sighup(proc, "reloaded: 3 key(s)")
        assert _publish(http, q, ADDED) == 200
        # a broken file: one clear line, and the keys in use stay
        keys.write_text('[{"key_sha256": "not hex", "scopes": ["produce"]}')
        _sighup(proc, "auth file not reloaded")
        assert _publish(http, q, ADDED) == 200 and _publish(http, q, HASHED) == 200
        keys.write_text(json.dumps([{"key_sha256": "abc", "scopes": ["produce"]}]))
        _sighup(proc, "auth file not reloaded")
        keys.write_text("[]")  # a reload never turns auth off
        _sighup(proc, "auth file not reloaded")
        assert _publish(http, q, "anything") == 401
        # a key removed from the file is refused after SIGHUP
        keys.write_text(json.dumps(_entries()))
        _sighup(proc, "reloaded: 2 key(s)")
        assert _publish(http, q, ADDED) == 401 and _publish(http, q, HASHED) == 200
    refusals = [line for line in proc.output if "auth file not reloaded" in line]
    assert len(refusals) == 3 and "key_sha256 must be 64 hex digits" in refusals[1]
    assert "the 3 key(s) in use stay" in refusals[0] and "holds no key" in refusals[2]


def test_keys_cli_makes_a_key_the_server_takes(node: tuple[ServerProcess, Path]) -> None:
    proc, keys = node
    made = subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", "keys", "new", "--scope", "produce"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    key, entry = made.stdout.splitlines()
    assert key not in entry and json.loads(entry)["key_sha256"] == hash_key(key).hex()
    keys.write_text(json.dumps([*_entries(), json.loads(entry)]))
    _sighup(proc, "reloaded: 3 key(s)")
    q = unique()
    with httpx.Client(base_url=proc.url) as http:
        assert http.put(f"/v1/queues/{q}", headers=_h(ADMIN)).status_code == 201
        assert _publish(http, q, key) == 200
    keys.write_text(json.dumps(_entries()))
    _sighup(proc, "reloaded: 2 key(s)")
