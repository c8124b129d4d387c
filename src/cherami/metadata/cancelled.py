"""Cancelled delayed messages (``MetadataStore.cancel_scheduled``): a tombstone row per
message of a timer extent, which every group's reader asks for when the messages come
due (roles/outputhost/readwindow.py). Shared by the two stores, which give their
parameter marker and two calls: write statements in one transaction, read rows.

A cancel also drops, in its transaction, the tombstones of the queue's extents that are
gone (deleted by retention or with their queue: an extent id is never used again), so
the table holds what can still matter, plus those of a queue that never cancels again."""

from __future__ import annotations

from typing import Any

Statement = tuple[str, tuple[Any, ...]]

# A cancel is refused (409 already_due) unless its tombstone is written this long before
# the message is due. An output host that has followed the change log (which a cancel
# writes to) from a time at most this long before a message's due time knows every
# cancel of it without asking (roles/outputhost/service.py), so delayed messages that
# come due early in a metadata outage are delivered (later ones wait for the store).
CANCEL_MARGIN_MS = 5000


class CancelledMessages:
    mark = "?"  # the store's parameter marker

    async def _write_all(self, statements: list[Statement]) -> object:
        raise NotImplementedError

    async def _read_all(self, query: Any, args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def cancel_scheduled(self, queue: str, extent: str, seqs: list[int]) -> None:
        m = self.mark
        gone = (
            f"DELETE FROM cancelled WHERE queue = {m} AND extent NOT IN "
            f"(SELECT id FROM extents WHERE queue = {m} AND status <> 'deleted')"
        )
        insert = f"INSERT INTO cancelled VALUES ({m}, {m}, {m}) ON CONFLICT DO NOTHING"
        await self._write_all(
            [(gone, (queue, queue)), *((insert, (queue, extent, n)) for n in seqs)]
        )

    async def cancelled_scheduled(self, queue: str, extent: str, lo: int, hi: int) -> set[int]:
        m = self.mark
        rows = await self._read_all(
            f"SELECT seq FROM cancelled WHERE queue = {m} AND extent = {m} "
            f"AND seq BETWEEN {m} AND {m}",
            (queue, extent, lo, hi),
        )
        return {r[0] for r in rows}

    async def cancelled_in(self, queue: str) -> dict[str, set[int]]:
        m = self.mark
        rows = await self._read_all(
            f"SELECT extent, seq FROM cancelled WHERE queue = {m}", (queue,)
        )
        found: dict[str, set[int]] = {}
        for extent, seq in rows:
            found.setdefault(extent, set()).add(seq)
        return found

    async def cancelled_everywhere(self) -> dict[str, dict[str, set[int]]]:
        rows = await self._read_all("SELECT queue, extent, seq FROM cancelled", ())
        found: dict[str, dict[str, set[int]]] = {}
        for queue, extent, seq in rows:
            found.setdefault(queue, {}).setdefault(extent, set()).add(seq)
        return found
