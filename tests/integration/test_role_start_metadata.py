"""A cluster role that cannot reach its PostgreSQL metadata when it starts (the server
down, restarting, or out of connection slots) waits for it, trying again with back-off
and saying so in one line, instead of exiting with a traceback (issue 34: a store host
restarted while PostgreSQL had no slot left exited with an AttributeError in
``RoleProcess.stop``). A signal meanwhile stops it cleanly. Real processes: a store host
and a private PostgreSQL server that is started only after the store host."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cherami.wire import handshake
from tests.support.blackhole import free_port
from tests.support.pg import PrivatePostgres

WAITING = "cannot start yet"


def _spawn(tmp: Path, name: str, metadata: str) -> tuple[subprocess.Popen[bytes], Path]:
    secret = tmp / "cluster.secret"
    if not secret.exists():
        secret.write_text(handshake.new_secret() + "\n")
        secret.chmod(0o600)
    log = tmp / f"{name}.log"
    cmd = [
        sys.executable, "-m", "cherami.cli.main", "serve", "--role", "storehost",
        "--metadata", metadata, "--data-dir", str(tmp / name), "--host", "127.0.0.1",
        "--port", "0", "--cluster-secret-file", str(secret),
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def _until(what: str, ok: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path,
           timeout: float) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout
    while not ok():
        text = log.read_text(errors="replace")
        assert proc.poll() is None, f"exited ({proc.returncode}) before {what}:\n{text[-3000:]}"
        assert time.monotonic() < deadline, f"not {what} within {timeout} s:\n{text[-3000:]}"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        text = log.read_text()[-3000:]
        raise AssertionError(f"no exit within 15 s of SIGTERM:\n{text}") from None
    text = log.read_text(errors="replace")
    assert code == 0, f"exit {code}:\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]


def test_a_store_host_waits_for_its_metadata_and_starts_when_it_answers(tmp_path: Path) -> None:
    pg = PrivatePostgres()  # not started yet: nothing listens on its port
    proc, log = _spawn(tmp_path, "storehost-0", pg.url("postgres") + "&schema=late")
    try:
        _until("waiting", lambda: WAITING in log.read_text(), proc, log, 30)
        text = log.read_text()
        assert text.count(WAITING) == 1, text  # one line, however many tries
        assert "metadata database unreachable" in text, text
        pg.start()
        _until("listening", lambda: "listening on" in log.read_text(), proc, log, 60)
        assert "reached the metadata after" in log.read_text()
        _stop(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pg.remove()


def test_a_store_host_waiting_for_its_metadata_stops_on_a_signal(tmp_path: Path) -> None:
    nothing = f"postgresql://postgres@127.0.0.1:{free_port()}/test?schema=none"
    proc, log = _spawn(tmp_path, "storehost-0", nothing)
    try:
        _until("waiting", lambda: WAITING in log.read_text(), proc, log, 30)
        _stop(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
