"""A private PostgreSQL primary with a streaming-replication standby, for tests of a
metadata store that fails over.

``PrimaryStandby.start()`` runs the primary (``PrivatePostgres``: initdb, its own port),
copies it with ``pg_basebackup -R`` into the standby's data directory and starts the
standby, which streams from the primary as ``standby``. With ``synchronous=True`` the
primary names it in ``synchronous_standby_names`` (set after the copy, so the standby
does not inherit it: once promoted, it must not wait for a standby of its own), and
``start`` returns once the standby is synchronous. ``kill_primary()`` SIGKILLs every
process of the primary at once (a machine lost); ``promote()`` runs ``pg_ctl promote``.
A missing PostgreSQL installation fails the test; it never skips it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

import psutil
import psycopg

from tests.support.pg import PG_BIN, PrivatePostgres

__all__ = ["PrimaryStandby", "wait_for"]

STANDBY = "standby"  # the standby's application name on the primary


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``check`` until it is true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def _one(url: str, query: str) -> object:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(query).fetchone()
        return None if row is None else row[0]


class PrimaryStandby:
    def __init__(self, synchronous: bool = True) -> None:
        self.synchronous = synchronous
        self.primary = PrivatePostgres()
        self.standby = PrivatePostgres()

    def url(self, dbname: str = "postgres", standby_first: bool = False) -> str:
        """A libpq multi-host URL naming both servers (the primary first, unless
        ``standby_first``)."""
        hosts = [self.primary, self.standby]
        if standby_first:
            hosts.reverse()
        where = ",".join(f"127.0.0.1:{pg.port}" for pg in hosts)
        return f"postgresql://postgres@{where}/{dbname}"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [str(PG_BIN / args[0]), *args[1:]], check=True, capture_output=True,
            **self.primary._run_as(),  # type: ignore[call-overload]
        )  # fmt: skip

    def start(self, timeout: float = 30.0) -> PrimaryStandby:
        self.primary.start(timeout)
        self._run(
            "pg_basebackup", "-D", str(self.standby.data_dir), "-h", "127.0.0.1",
            "-p", str(self.primary.port), "-U", "postgres", "-R", "-X", "stream", "--no-sync",
        )  # fmt: skip
        with open(self.standby.data_dir / "postgresql.conf", "a") as conf:
            conf.write(f"cluster_name = '{STANDBY}'\n")  # its application name upstream
        if self.synchronous:
            with psycopg.connect(self.primary.url(), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
                conn.execute("SELECT pg_reload_conf()")
        self.standby.start(timeout)
        state = "sync" if self.synchronous else "async"
        wait_for(
            f"the standby streams ({state})",
            lambda: _one(
                self.primary.url(),
                f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{STANDBY}'",
            ) == state,
            timeout,
        )  # fmt: skip
        return self

    def caught_up(self) -> bool:
        """Whether the standby has replayed everything the primary has written."""
        lsn = _one(self.primary.url(), "SELECT pg_current_wal_lsn()::text")
        return bool(_one(self.standby.url(), f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"))

    def kill_primary(self) -> None:
        """SIGKILL the primary's every process at once, as if its machine were lost."""
        proc = self.primary.proc
        assert proc is not None and proc.poll() is None, "the primary is not running"
        os.kill(proc.pid, signal.SIGSTOP)  # forks nothing more; its children run on
        children = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        for child in children:  # each backend leads a process group of its own
            child.kill()
        psutil.wait_procs(children, timeout=10)
        proc.wait()
        self.primary.proc = None

    def promote(self, timeout: float = 30.0) -> None:
        """``pg_ctl promote`` the standby and wait until it takes writes."""
        data = str(self.standby.data_dir)
        self._run("pg_ctl", "promote", "-w", "-t", str(int(timeout)), "-D", data)
        wait_for(
            "the promoted standby takes writes",
            lambda: _one(self.standby.url(), "SELECT NOT pg_is_in_recovery()") is True,
            timeout,
        )

    def timeline(self, pg: PrivatePostgres) -> int:
        """The timeline ``pg`` writes on (a primary)."""
        name = _one(pg.url(), "SELECT pg_walfile_name(pg_current_wal_lsn())")
        return int(str(name)[:8], 16)

    def remove(self) -> None:
        self.standby.remove()
        self.primary.remove()
