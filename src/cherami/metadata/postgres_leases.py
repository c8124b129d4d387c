"""The PostgreSQL store's leases (postgres.py): a lease with its own expiry
(``try_lease``), and the output hosts' host leases with the units they cover
(hostleases.py), and the fenced writes' check (``_check_fence``) with the ack levels
written under fences. Expiry is judged by the server's clock, shared by all hosts. A take
locks the unit rows, then the host rows of their holders (always in that order, each in
name order: two takes never wait on each other in a cycle), so no renewal of a session
it ends commits between its look and its write; a fenced write's share lock on a unit
row holds a take of that unit back until the write ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from cherami.errors import Fenced
from cherami.metadata.acklevels import level_row, put_ack_level_sql
from cherami.metadata.hostleases import HostRow, UnitRow, holders_to_lock, plan_take
from cherami.metadata.models import AckLevel, Fence
from cherami.metadata.postgres_failover import EPOCH_FLOOR
from cherami.metadata.postgres_schema import NOW

Row = tuple[Any, ...]

_HOLDERS = (
    "SELECT l.name, l.holder FROM leases l LEFT JOIN host_leases h ON h.host = l.holder "
    "WHERE {where} AND CASE WHEN l.session IS NULL THEN l.expires_at >= {now} "
    "ELSE h.session = l.session AND h.expires_at >= {now} END"
)


def held_leases(where: str) -> str:
    """The query of the leases held now (name, holder) that match ``where`` (on ``l``,
    the leases table), by either rule: a lease's own expiry, or its holder's host lease
    in the session it names. What tests that read a cluster's leases ask too."""
    return _HOLDERS.format(where=where, now=NOW)


_PUT_ACK_LEVEL = put_ack_level_sql("%s")


async def _check_fence(cur: psycopg.AsyncCursor[Row], fence: Fence | None) -> None:
    """Inside a transaction: raise Fenced unless the lease is still in the fence's
    epoch. The row lock holds a takeover back until the transaction ends (a takeover
    locks the row FOR UPDATE first: ``try_lease``, ``take_units``), so no write of an old holder
    lands after a new holder has taken the lease. KEY SHARE, not SHARE: the holder's
    own renewal (an update of no key column) does not wait for its fenced writes; with
    SHARE a leader with dozens of them under way at once could not renew at all."""
    if fence is None:
        return
    await cur.execute("SELECT epoch FROM leases WHERE name = %s FOR KEY SHARE", (fence.lease,))
    row = await cur.fetchone()
    if row is None or row[0] != fence.epoch:
        raise Fenced(f"lease {fence.lease} moved past epoch {fence.epoch}")


class PostgresLeases:
    async def _fetchall(self, query: Any, args: Any) -> list[Row]:
        raise NotImplementedError

    def _connection(self) -> Any:
        raise NotImplementedError

    async def _fetch_in_lane(self, query: Any, args: Any) -> list[Row]:
        """A renewal's statement, on a connection other calls leave free (postgres.py)."""
        raise NotImplementedError

    async def lease_holder(self, name: str) -> str | None:
        rows = await self._fetchall(held_leases("l.name = %s"), (name,))
        return str(rows[0][1]) if rows else None

    async def lease_holders(self, prefix: str) -> dict[str, str]:
        rows = await self._fetchall(
            held_leases("substr(l.name, 1, %s) = %s"), (len(prefix), prefix)
        )
        return {str(name): str(holder) for name, holder in rows}

    async def renew_leases(
        self, names: list[str], holder: str, ttl_seconds: float
    ) -> dict[str, int]:
        if not names:
            return {}
        rows = await self._fetch_in_lane(
            f"UPDATE leases SET expires_at = {NOW} + %s WHERE holder = %s "
            "AND session IS NULL AND name = ANY(%s) RETURNING name, epoch",
            (ttl_seconds, holder, names),
        )
        return {str(name): int(epoch) for name, epoch in rows}

    async def try_lease(self, name: str, holder: str, ttl_seconds: float) -> int | None:
        return (await self.try_leases([name], holder, ttl_seconds)).get(name)

    async def try_leases(self, names: list[str], holder: str, ttl_seconds: float) -> dict[str, int]:
        # A new holder, or one granted before a failover, gets an epoch above any that
        # timeline granted (postgres_failover.py). In name order: two hosts taking
        # overlapping sets lock their rows in one order. Another holder's rows are locked
        # FOR UPDATE first: a takeover waits for the old holder's fenced writes under
        # way (their FOR KEY SHARE, postgres.py), which a renewal does not.
        rows = await self._fetch_in_lane(
            "WITH o AS (SELECT name FROM leases WHERE name = ANY(%s) AND holder <> %s "
            "ORDER BY name FOR UPDATE), "
            f"t AS (SELECT {EPOCH_FLOOR} AS floor FROM (SELECT count(*) FROM o) AS locked) "
            "INSERT INTO leases AS l (name, holder, expires_at, epoch) "
            f"SELECT n, %s, {NOW} + %s, greatest(1, floor) FROM t, unnest(%s::text[]) AS n "
            "ORDER BY n ON CONFLICT (name) DO UPDATE SET "
            "holder = excluded.holder, expires_at = excluded.expires_at, "
            "epoch = CASE WHEN l.holder = excluded.holder AND l.epoch >= excluded.epoch "
            "THEN l.epoch ELSE greatest(l.epoch + 1, excluded.epoch) END "
            "WHERE l.session IS NULL "
            f"AND (l.holder = excluded.holder OR l.expires_at < {NOW}) RETURNING l.name, l.epoch",
            (sorted(set(names)), holder, holder, ttl_seconds, sorted(set(names))),
        )
        return {str(name): int(epoch) for name, epoch in rows}

    # host leases (hostleases.py)
    async def begin_host_lease(self, host: str, ttl_seconds: float) -> int | None:
        rows = await self._fetchall(
            f"WITH t AS (SELECT {EPOCH_FLOOR} AS floor) "
            "INSERT INTO host_leases AS h (host, session, expires_at) "
            f"SELECT %s, greatest(1, floor), {NOW} + %s FROM t ON CONFLICT (host) DO UPDATE "
            "SET session = greatest(h.session + 1, excluded.session), "
            f"expires_at = excluded.expires_at WHERE h.expires_at < {NOW} RETURNING h.session",
            (host, ttl_seconds),
        )
        return int(rows[0][0]) if rows else None

    async def renew_host_lease(self, host: str, session: int, ttl_seconds: float) -> bool:
        rows = await self._fetch_in_lane(
            f"UPDATE host_leases SET expires_at = {NOW} + %s WHERE host = %s AND session = %s "
            "RETURNING 1",
            (ttl_seconds, host, session),
        )
        return bool(rows)

    async def take_units(
        self, names: list[str], host: str, session: int, ttl_seconds: float
    ) -> dict[str, int] | None:
        names = sorted(set(names))
        async with self._connection() as conn, conn.transaction():
            cur: psycopg.AsyncCursor[Row] = conn.cursor()
            await cur.execute(
                "SELECT name, holder, session, expires_at FROM leases WHERE name = ANY(%s) "
                "ORDER BY name FOR UPDATE",
                (names,),
            )
            units: dict[str, UnitRow] = {r[0]: (r[1], r[2], r[3]) for r in await cur.fetchall()}
            await cur.execute(
                f"SELECT host, session, expires_at, {NOW}, {EPOCH_FLOOR} FROM host_leases "
                "WHERE host = ANY(%s) ORDER BY host FOR UPDATE",
                (holders_to_lock(units, host),),
            )
            found = await cur.fetchall()
            hosts: dict[str, HostRow] = {r[0]: (r[1], r[2]) for r in found}
            if not found:
                return None
            now, floor = found[0][3], found[0][4]
            plan = plan_take(names, units, hosts, host, session, now)
            if plan is None:
                return None
            if plan.end:
                await cur.execute(
                    "UPDATE host_leases SET session = greatest(session + 1, %s) "
                    "WHERE host = ANY(%s)",
                    (floor, plan.end),
                )
            await cur.execute(
                f"UPDATE host_leases SET expires_at = {NOW} + %s, changes = changes + 1 "
                "WHERE host = %s",
                (ttl_seconds, host),
            )
            await cur.execute(
                "UPDATE leases SET holder = %s, session = %s, expires_at = 0, epoch = CASE "
                "WHEN name = ANY(%s) THEN epoch ELSE greatest(epoch + 1, %s) END "
                "WHERE name = ANY(%s) RETURNING name, epoch",
                (host, session, plan.keep, floor, plan.taken),
            )
            rows = await cur.fetchall()
            if plan.new:  # a row inserted meanwhile is another's take: left alone
                await cur.execute(
                    "INSERT INTO leases (name, holder, expires_at, epoch, session) "
                    "SELECT n, %s, 0, greatest(1, %s), %s FROM unnest(%s::text[]) AS n "
                    "ORDER BY n ON CONFLICT (name) DO NOTHING RETURNING name, epoch",
                    (host, floor, session, plan.new),
                )
                rows += await cur.fetchall()
        return {str(name): int(epoch) for name, epoch in rows}

    async def release_units(self, names: list[str], host: str, session: int) -> None:
        if names:
            await self._fetchall(
                "WITH h AS (UPDATE host_leases SET changes = changes + 1, released_until = "
                "greatest(released_until, expires_at) WHERE host = %s RETURNING expires_at) "
                "UPDATE leases SET session = NULL, expires_at = (SELECT expires_at FROM h) "
                "WHERE holder = %s AND session = %s AND name = ANY(%s) RETURNING 1",
                (host, host, session, names),
            )

    async def lease_stamp(self) -> tuple[tuple[Any, ...], ...]:
        rows = await self._fetchall(
            f"SELECT host, session, changes, expires_at >= {NOW}, released_until >= {NOW} "
            "FROM host_leases ORDER BY host",
            (),
        )
        return tuple(tuple(row) for row in rows)

    async def put_ack_levels(self, levels: list[AckLevel], fence: Fence | None = None) -> None:
        async with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            await _check_fence(cur, fence)
            await cur.executemany(_PUT_ACK_LEVEL, [level_row(a) for a in levels])

    async def put_fenced_ack_levels(
        self, writes: Sequence[tuple[Fence, list[AckLevel]]]
    ) -> set[Fence]:
        if not writes:
            return set()
        names = sorted({fence.lease for fence, _ in writes})
        async with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            # every lease row locked as one fenced write locks it (_check_fence), in
            # name order as a takeover locks them (no deadlock between the two)
            await cur.execute(
                "SELECT name, epoch FROM leases WHERE name = ANY(%s) ORDER BY name FOR KEY SHARE",
                (names,),
            )
            epochs = {name: epoch for name, epoch in await cur.fetchall()}
            refused = {fence for fence, _ in writes if epochs.get(fence.lease) != fence.epoch}
            rows = sorted(
                (level_row(a) for fence, levels in writes if fence not in refused for a in levels),
                key=lambda row: row[:3],
            )
            if rows:
                await cur.executemany(_PUT_ACK_LEVEL, rows)
        return refused
