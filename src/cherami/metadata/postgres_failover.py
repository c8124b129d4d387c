"""What the PostgreSQL store (postgres.py) does about a primary that fails over to a standby.

- It connects only to a server that accepts writes: a multi-host URL
  (``postgresql://h1:5432,h2:5432/db``, or ``?host=h1,h2&port=...``) is tried host by
  host, and libpq refuses a standby (``target_session_attrs=read-write``, added when the
  URL does not say; a URL that allows a standby is a ConfigError).
- A server that vanishes without closing its connections (a lost machine, a partition)
  breaks them within seconds rather than when TCP gives up (minutes): TCP keepalives and
  ``tcp_user_timeout`` are on unless the URL sets them.
- Its pool drops a connection that broke (the primary died, restarted or was demoted)
  instead of lending it again, and closes one whose server has turned read-only; both
  answer ``Unavailable``, and the next connection goes to whichever host is the primary.
  A connection idle in the pool for ``CHECK_IDLE`` or more is checked with a round trip
  before it is lent; one used more recently is lent as it is (a call on it that finds it
  broken answers ``Unavailable`` once, and the pool drops it): checked at every call,
  the check was 17-22% of the CPU of a busy leader and output host, and a round trip
  more per call.
- A server known to be unreachable is not waited for: when the pool fails to connect,
  the calls waiting for a connection fail at once (``Unavailable``), and until a
  connection succeeds again a call waits at most ``UNREACHABLE_WAIT`` for one (each
  call lets the pool try to connect again, so the first call after the server is back
  gets through). Only a server that is slow, or unreachable in a way that takes the
  connect timeout to find out (a partition), costs a call the pool's full timeout. A
  stopped PostgreSQL held every process's metadata calls 5 s (the pool timeout) at the
  start of an outage, and every publish and delivery behind them.
- Lease epochs carry the server's timeline: an epoch granted on timeline T is at least
  ``(T - 1) << 32``, and a promotion starts a new timeline. So if the old primary granted
  epochs that never reached the standby (asynchronous replication loses such a tail), the
  promoted one never grants the same numbers again: a write fenced by one is refused for
  good, and no holder's epoch goes backwards. docs/operations.md says which replication
  settings keep the rest of that tail (extents, ack levels) too."""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from cherami.errors import ConfigError, Unavailable

__all__ = ["EPOCH_FLOOR", "FailoverPool", "failover_conninfo"]

Row = tuple[Any, ...]

_WRITABLE = ("read-write", "primary")
# a connection idle in the pool this long is checked (a round trip) before it is lent
CHECK_IDLE = 1.0
# while the pool's last attempt to connect failed, a call waits this long for a connection
# at most (the lease margin: an output host learns of an outage sooner than its lease ends)
UNREACHABLE_WAIT = 0.5
# what a URL gets unless it says otherwise: an idle connection probed after 5 s, every 2 s,
# given up after 3 unanswered probes; a request unacknowledged for 10 s breaks it
_TCP = {
    "keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2",
    "keepalives_count": "3", "tcp_user_timeout": "10000",
}  # fmt: skip

# The lowest epoch a lease may be granted at on this server: (timeline - 1) << 32. The
# timeline is the first 8 hex digits of the current WAL file's name (on a primary).
EPOCH_FLOOR = (
    "((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 32)"
)


def failover_conninfo(url: str) -> str:
    """``url`` as a conninfo that only a server accepting writes answers, with the TCP
    settings it does not give."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError as err:
        raise ConfigError(f"metadata URL: {err}") from None
    attrs = given.get("target_session_attrs", "read-write")
    if attrs not in _WRITABLE:
        raise ConfigError(
            f"metadata URL: target_session_attrs={attrs} may reach a standby; "
            "the store writes: use read-write or primary"
        )
    added = {k: v for k, v in _TCP.items() if k not in given}
    return make_conninfo(url, target_session_attrs=attrs, **added)


def _server_full(err: psycopg.OperationalError) -> bool:
    """Whether a connect was refused because the server has no connection slot left (it
    is there: not an outage). libpq gives no SQLSTATE for a refused connect, only the
    server's message (53300, in English unless the server's lc_messages says otherwise;
    a translated one counts as unreachable: its callers get 503 sooner, and retry)."""
    text = str(err)
    return "too many clients" in text or "connection slots are reserved" in text


class FailoverPool(AsyncConnectionPool[psycopg.AsyncConnection[Row]]):
    """A pool whose connections raise ``Unavailable`` for an unreachable database
    (refused, lost, timed out, shut down) instead of psycopg's OperationalError, and
    for a server that no longer takes writes, whose connection it closes (a closed
    connection goes back to the pool to be discarded). A server it cannot connect to is
    not waited for (the module's docstring)."""

    unreachable_since: float | None = None  # time.monotonic() of the first failed connect

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # when each connection was last given back (time.monotonic()): _check
        self._given_back: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Row], float] = (
            weakref.WeakKeyDictionary()
        )
        super().__init__(*args, check=self._check, **kwargs)

    async def _check(self, conn: psycopg.AsyncConnection[Row]) -> None:
        """Check a connection idle for CHECK_IDLE or more (see the module)."""
        given_back = self._given_back.get(conn)
        if given_back is None or time.monotonic() - given_back >= CHECK_IDLE:
            await AsyncConnectionPool.check_connection(conn)

    async def _connect(self, timeout: float | None = None) -> psycopg.AsyncConnection[Row]:
        try:
            conn = await super()._connect(timeout)
        except psycopg.OperationalError as err:
            if _server_full(err):
                raise  # the server is there, only full: wait for a connection to free
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
            # the calls waiting for a connection would wait the whole pool timeout for the
            # next attempt (psycopg_pool retries with a back-off): they fail now
            waiting = getattr(self, "_waiting", None)
            while waiting:
                await waiting.popleft().fail(err)
            raise
        self.unreachable_since = None
        return conn

    @asynccontextmanager
    async def connection(
        self, timeout: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        if self.unreachable_since is not None:
            timeout = min(self.timeout if timeout is None else timeout, UNREACHABLE_WAIT)
        try:
            async with super().connection(timeout) as conn:
                try:
                    yield conn
                except psycopg.errors.ReadOnlySqlTransaction:
                    await conn.close()
                    raise
                finally:
                    self._given_back[conn] = time.monotonic()
        except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction) as err:
            raise Unavailable(f"metadata database unavailable: {err}") from err
