"""The SQLite store's leases (sqlite.py): a lease with its own expiry (``try_lease``),
and the output hosts' host leases with the units they cover (hostleases.py). Every write
runs on the store's one writing thread, so a take and a renewal never interleave."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cherami.metadata.hostleases import HostRow, UnitRow, holders_to_lock, plan_take

T = TypeVar("T")

# a lease is held: its own expiry, or its holder's host lease in the session it names
_HELD = (
    "CASE WHEN l.session IS NULL THEN l.expires_at >= ? "
    "ELSE h.session = l.session AND h.expires_at >= ? END"
)
_HOLDERS = "SELECT l.name, l.holder FROM leases l LEFT JOIN host_leases h ON h.host = l.holder "


def _in(names: list[str]) -> str:
    return json.dumps(names)


class SqliteLeases:
    clock: Callable[[], float]

    @property
    def _db(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _run(self, fn: Callable[[], T]) -> Awaitable[T]:
        raise NotImplementedError

    def _write(self, fn: Callable[[], T]) -> Awaitable[T]:
        raise NotImplementedError

    async def lease_holder(self, name: str) -> str | None:
        return (await self._holders("l.name = ?", (name,))).get(name)

    async def lease_holders(self, prefix: str) -> dict[str, str]:
        return await self._holders("substr(l.name, 1, ?) = ?", (len(prefix), prefix))

    async def _holders(self, where: str, args: tuple[Any, ...]) -> dict[str, str]:
        def read() -> list[Any]:
            now = self.clock()
            sql = f"{_HOLDERS} WHERE {where} AND {_HELD}"
            return self._db.execute(sql, (*args, now, now)).fetchall()

        return {str(name): str(holder) for name, holder in await self._run(read)}

    async def renew_leases(
        self, names: list[str], holder: str, ttl_seconds: float
    ) -> dict[str, int]:
        def renew() -> dict[str, int]:
            rows = self._db.execute(
                "UPDATE leases SET expires_at = ? WHERE holder = ? AND session IS NULL "
                "AND name IN (SELECT value FROM json_each(?)) RETURNING name, epoch",
                (self.clock() + ttl_seconds, holder, _in(names)),
            ).fetchall()
            return {str(name): int(epoch) for name, epoch in rows}

        return await self._write(renew) if names else {}

    async def try_lease(self, name: str, holder: str, ttl_seconds: float) -> int | None:
        return (await self.try_leases([name], holder, ttl_seconds)).get(name)

    async def try_leases(self, names: list[str], holder: str, ttl_seconds: float) -> dict[str, int]:
        def take() -> dict[str, int]:
            now = self.clock()
            rows = [(name, self._db.execute(
                "INSERT INTO leases (name, holder, expires_at, epoch) VALUES (?, ?, ?, 1) "
                "ON CONFLICT (name) DO UPDATE SET "
                "holder = excluded.holder, expires_at = excluded.expires_at, epoch = CASE "
                "WHEN leases.holder = excluded.holder THEN leases.epoch ELSE leases.epoch + 1 END "
                "WHERE leases.session IS NULL "
                "AND (leases.holder = excluded.holder OR leases.expires_at < ?) RETURNING epoch",
                (name, holder, now + ttl_seconds, now),
            ).fetchone()) for name in sorted(set(names))]  # fmt: skip
            return {name: int(row[0]) for name, row in rows if row}

        return await self._write(take) if names else {}

    # host leases (hostleases.py)
    async def begin_host_lease(self, host: str, ttl_seconds: float) -> int | None:
        def begin() -> int | None:
            now = self.clock()
            row = self._db.execute(
                "INSERT INTO host_leases (host, session, expires_at) VALUES (?, 1, ?) "
                "ON CONFLICT (host) DO UPDATE SET session = host_leases.session + 1, "
                "expires_at = excluded.expires_at "
                "WHERE host_leases.expires_at < ? RETURNING session",
                (host, now + ttl_seconds, now),
            ).fetchone()
            return None if row is None else int(row[0])

        return await self._write(begin)

    async def renew_host_lease(self, host: str, session: int, ttl_seconds: float) -> bool:
        def renew() -> bool:
            return self._renew_host(host, session, ttl_seconds)

        return await self._write(renew)

    def _renew_host(self, host: str, session: int, ttl_seconds: float) -> bool:
        return (
            self._db.execute(
                "UPDATE host_leases SET expires_at = ? WHERE host = ? AND session = ?",
                (self.clock() + ttl_seconds, host, session),
            ).rowcount
            == 1
        )

    async def take_units(
        self, names: list[str], host: str, session: int, ttl_seconds: float
    ) -> dict[str, int] | None:
        def take() -> dict[str, int] | None:
            db, now = self._db, self.clock()
            units: dict[str, UnitRow] = {
                name: (holder, held_in, expires_at)
                for name, holder, held_in, expires_at in db.execute(
                    "SELECT name, holder, session, expires_at FROM leases "
                    "WHERE name IN (SELECT value FROM json_each(?))", (_in(names),)
                )
            }  # fmt: skip
            hosts: dict[str, HostRow] = {
                name: (held_in, expires_at)
                for name, held_in, expires_at in db.execute(
                    "SELECT host, session, expires_at FROM host_leases "
                    "WHERE host IN (SELECT value FROM json_each(?))",
                    (_in(holders_to_lock(units, host)),),
                )
            }
            plan = plan_take(names, units, hosts, host, session, now)
            if plan is None:
                return None
            db.execute(
                "UPDATE host_leases SET session = session + 1 "
                "WHERE host IN (SELECT value FROM json_each(?))", (_in(plan.end),)
            )  # fmt: skip
            self._renew_host(host, session, ttl_seconds)
            db.execute("UPDATE host_leases SET changes = changes + 1 WHERE host = ?", (host,))
            rows = db.execute(
                "UPDATE leases SET holder = ?, session = ?, expires_at = 0, epoch = CASE "
                "WHEN name IN (SELECT value FROM json_each(?)) THEN epoch ELSE epoch + 1 END "
                "WHERE name IN (SELECT value FROM json_each(?)) RETURNING name, epoch",
                (host, session, _in(plan.keep), _in(plan.taken)),
            ).fetchall()
            rows += db.execute(
                "INSERT INTO leases (name, holder, expires_at, epoch, session) "
                "SELECT value, ?, 0, 1, ? FROM json_each(?) RETURNING name, epoch",
                (host, session, _in(plan.new)),
            ).fetchall()
            return {str(name): int(epoch) for name, epoch in rows}

        return await self._write(take)

    async def release_units(self, names: list[str], host: str, session: int) -> None:
        def release() -> None:
            self._db.execute(
                "UPDATE leases SET session = NULL, expires_at = "
                "(SELECT expires_at FROM host_leases WHERE host = ?) "
                "WHERE holder = ? AND session = ? AND name IN (SELECT value FROM json_each(?))",
                (host, host, session, _in(names)),
            )
            self._db.execute(
                "UPDATE host_leases SET changes = changes + 1, "
                "released_until = max(released_until, expires_at) WHERE host = ?", (host,)
            )  # fmt: skip

        if names:
            await self._write(release)

    async def lease_stamp(self) -> tuple[tuple[Any, ...], ...]:
        def read() -> tuple[tuple[Any, ...], ...]:
            now = self.clock()
            return tuple(map(tuple, self._db.execute(
                "SELECT host, session, changes, expires_at >= ?, released_until >= ? "
                "FROM host_leases ORDER BY host", (now, now),
            ).fetchall()))  # fmt: skip

        return await self._run(read)
