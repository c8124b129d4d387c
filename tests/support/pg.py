"""A private PostgreSQL server for tests that stop, crash or restart the database.

``PrivatePostgres`` runs ``initdb`` once into its own data directory, then ``start()``,
``stop()`` and ``start()`` again on the same port and data, so a client that reconnects
finds the same rows. The ``private_postgres`` fixture starts one per test and removes it
afterwards. A missing PostgreSQL installation fails the test; it never skips it.

PostgreSQL refuses to run as root: under root the server runs as the ``postgres`` user,
in a directory of its own under the system temporary directory (pytest's ``tmp_path`` is
private to root)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

__all__ = ["PG_BIN", "PrivatePostgres", "private_postgres"]

PG_BIN = Path(os.environ.get("CHERAMI_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))

_AS_ROOT = os.geteuid() == 0
_RUN_AS = "postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """One PostgreSQL server on 127.0.0.1:``port`` (or ``listen``: an address of this
    machine, such as a bridge that network namespaces reach) with trust authentication."""

    def __init__(self, port: int | None = None, listen: str = "127.0.0.1") -> None:
        self.port = port or _free_port()
        self.listen = listen
        self.root = Path(tempfile.mkdtemp(prefix="cherami-pg-"))
        self.data_dir = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        if _AS_ROOT:
            shutil.chown(self.root, _RUN_AS, _RUN_AS)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@{self.listen}:{self.port}/{dbname}?connect_timeout=5"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _run_as(self) -> dict[str, str]:
        return {"user": _RUN_AS, "group": _RUN_AS} if _AS_ROOT else {}

    def _initdb(self) -> None:
        subprocess.run(
            [
                str(PG_BIN / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                "--auth=trust", "-E", "UTF8", "--no-sync",
            ],
            check=True, capture_output=True, **self._run_as(),  # type: ignore[call-overload]
        )  # fmt: skip
        if self.listen != "127.0.0.1":  # clients come from other addresses
            with open(self.data_dir / "pg_hba.conf", "a") as hba:
                hba.write("host all all 0.0.0.0/0 trust\n")

    def start(self, timeout: float = 30.0) -> PrivatePostgres:
        """Start the server (running ``initdb`` the first time) and wait until it accepts
        connections; raises RuntimeError if it exits or does not answer in ``timeout``."""
        if self.running:
            return self
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        cmd = [
            str(PG_BIN / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
            "-c", f"listen_addresses={self.listen}", "-c", "unix_socket_directories=",
            "-c", "fsync=off", "-c", "max_connections=200",
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        try:
            self.proc = subprocess.Popen(  # type: ignore[call-overload]
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                **self._run_as(),
            )  # fmt: skip
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"postgres exited:\n{self.log()}")
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"postgres did not accept connections in {timeout}s:\n{self.log()}")

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Stop the server: ``fast`` (SIGINT: roll back sessions, checkpoint) or
        ``immediate`` (SIGQUIT: a crash; recovery runs at the next start)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT if mode == "immediate" else signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def remove(self) -> None:
        """Stop the server and delete its data."""
        self.stop(mode="immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL server of this test's own, removed afterwards."""
    pg = PrivatePostgres().start()
    try:
        yield pg
    finally:
        pg.remove()
