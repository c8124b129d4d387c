"""Group commit for the SQLite metadata store: every write waits for its transaction's
commit, which syncs the write-ahead log (``synchronous=FULL``), and one commit a write
made the sync the cost of every create: a queue and its two groups took five of them
in a row. Writes that come while one is being written are gathered and committed
together, one sync for all of them, each in a savepoint of its own, so one write that
fails (a name taken, a stale fence) leaves the others whole. A write is answered only
after the commit that holds it, as before; reads do not wait for writes.

A batch is one job on the store's writing thread; reads run on a connection and thread
of their own (sqlite.py). Also here: how the store's connections are opened, and which
SQLite errors mean the database cannot be used now."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from cherami.errors import Unavailable

# Result codes that mean "the database cannot be used now" (busy, locked, I/O, full, ...),
# not "this statement is wrong": calls raise Unavailable for them.
_UNAVAILABLE_CODES = frozenset({
    sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL,
})  # fmt: skip

MAX_BATCH = 256  # writes in one transaction at most (a long one holds the readers back)

_Write = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class GroupCommit:
    def __init__(self, db: sqlite3.Connection, executor: Executor) -> None:
        self._db = db
        self._executor = executor
        self._lock = threading.Lock()
        self._waiting: list[_Write] = []
        self._scheduled = False  # a batch job is queued or running on the thread

    def write(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``fn`` (statements, no transaction of its own) in the next batch; the
        future gets what it returns, or what it raised, once the batch is committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._waiting.append((fn, future, loop))
            start, self._scheduled = not self._scheduled, True
        if start:
            self._executor.submit(self._batch)
        return future

    def _batch(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
        results = self._commit(batch)
        for (_, future, loop), result in zip(batch, results, strict=True):
            try:
                loop.call_soon_threadsafe(_settle, future, result)
            except RuntimeError:  # its loop is closed: nobody waits for it
                pass
        with self._lock:
            if self._waiting:
                self._executor.submit(self._batch)  # behind the reads queued meanwhile
            else:
                self._scheduled = False

    def _commit(self, batch: list[_Write]) -> list[tuple[bool, Any]]:
        db = self._db
        results: list[tuple[bool, Any]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                for fn, _, _ in batch:
                    db.execute("SAVEPOINT w")
                    try:
                        results.append((True, fn()))
                    except Exception as err:
                        db.execute("ROLLBACK TO w")
                        results.append((False, err))
                    db.execute("RELEASE w")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except Exception as err:  # nothing of the batch was committed
            return [(False, err)] * len(batch)
        return results


def _settle(future: asyncio.Future[Any], result: tuple[bool, Any]) -> None:
    if future.done():  # its caller gave up waiting
        return
    ok, value = result
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def unavailable(err: sqlite3.OperationalError) -> Exception:
    """Unavailable for a result code that means the database cannot be used now (the
    primary code: busy, locked, I/O, full, ...); the error itself for a wrong statement."""
    if err.sqlite_errorcode & 0xFF in _UNAVAILABLE_CODES:
        return Unavailable(f"metadata database unavailable: {err}")
    return err


def connect(path: str) -> sqlite3.Connection:
    """A connection for either thread: autocommit (writes open their own transaction),
    the write-ahead log, a sync at every commit, and 5 s of patience with a lock."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA busy_timeout=5000")
    return db
