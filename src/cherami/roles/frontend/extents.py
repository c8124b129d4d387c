"""Routes for stream-mode consumer groups: the extents of a queue (where to read them)
and a group's offsets (its ack levels as ``{extent: next_seq}``).

Stream-mode readers (the Spark source) read plain extents straight from the store hosts
and keep their own position; they commit it here. Offsets only move forward. Timer
(delayed-message) extents carry no stream offsets: stream-mode groups see plain
extents only."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from aiohttp import web

from cherami.errors import CheramiError, InvalidRequest
from cherami.httpbase import decode, json_response
from cherami.membership import INPUTHOST
from cherami.metadata.models import DELETED, OPEN, STREAM, AckLevel, Extent, Group, check_name
from cherami.roles.frontend.clusterview import HostView, read_hosts
from cherami.roles.frontend.context import Frontend
from cherami.roles.frontend.convert import rfc3339
from cherami.roles.frontend.schemas import OffsetsBody
from cherami.wire.keys import plain_key
from cherami.wire.store import PLAIN


def next_seqs(levels: list[AckLevel], plain: set[str]) -> dict[str, int]:
    """A group's offsets: for each plain extent it has acked in, the next sequence to read."""
    return {
        a.extent: a.acked + 1 for a in sorted(levels, key=lambda a: a.extent) if a.extent in plain
    }


def advance(
    current: dict[str, AckLevel], wanted: dict[str, int], queue: str, group: str
) -> list[AckLevel]:
    """The ack-level rows that move ``current`` forward to ``wanted``; never backward."""
    rows = []
    for extent, next_seq in sorted(wanted.items()):
        acked = next_seq - 1
        level = current.get(extent)
        if acked <= (level.acked if level is not None else 0):
            continue
        rows.append(AckLevel(queue=queue, group=group, extent=extent,
                             level=plain_key(acked), acked=acked))  # fmt: skip
    return rows


class StreamGroupRoutes:
    def __init__(self, frontend: Frontend) -> None:
        self.f = frontend
        # a group's lock while a commit holds or awaits it (none kept for a group at rest)
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    async def _last_seq(self, extent: Extent) -> int:
        """How far every reachable replica holds the extent: what was acked to producers."""
        if extent.status != OPEN and extent.sealed_seq is not None:
            return extent.sealed_seq
        seqs = []
        for store_id in extent.stores:
            try:
                (info,) = await self.f.r.stores.get(store_id).info([extent.id])
            except CheramiError:
                continue
            if info.exists:
                seqs.append(info.last_seq)
        return min(seqs) if seqs else 0

    def _address(self, store_id: str) -> str:
        """A replica's address as a reader dials it: ``tls://host:port`` when this
        cluster's store links run TLS (wire/tls.py), else ``host:port``."""
        try:
            address = self.f.r.stores.get(store_id).address
        except CheramiError:
            return ""
        return f"tls://{address}" if self.f.ctx.tls_client is not None else address

    async def _extent_json(
        self, extent: Extent, hosts: HostView, rates: dict[str, float]
    ) -> dict[str, Any]:
        return {
            "id": extent.id,
            "kind": extent.kind,
            "status": extent.status,
            "sealed_seq": extent.sealed_seq,
            "created_at": rfc3339(int(extent.created_at * 1000)),
            "stores": [a for a in map(self._address, extent.stores) if a],
            "last_seq": await self._last_seq(extent),
            "input_host": hosts.address(extent.input_host),
            "rate": rates.get(extent.id, 0.0) if extent.status == OPEN else 0.0,
        }

    async def list_extents(self, request: web.Request) -> web.Response:
        queue = await self.f.queue(request, "consume")
        extents = [
            e for e in await self.f.r.metadata.list_extents(queue.name) if e.status != DELETED
        ]
        extents.sort(key=lambda e: (e.created_at, e.id))
        hosts = await read_hosts(self.f.r.metadata, self.f.ctx.timing.dead_after)
        rates = hosts.rates(INPUTHOST)
        body = await asyncio.gather(*(self._extent_json(e, hosts, rates) for e in extents))
        return json_response({"extents": list(body)})

    async def _group(self, request: web.Request) -> tuple[Group, set[str]]:
        queue = await self.f.queue(request, "consume")
        name = check_name("group", request.match_info["group"])
        group = await self.f.r.metadata.get_group(queue.name, name)
        extents = await self.f.r.metadata.list_extents(queue.name)
        return group, {e.id for e in extents if e.kind == PLAIN and e.status != DELETED}

    async def get_offsets(self, request: web.Request) -> web.Response:
        group, plain = await self._group(request)
        levels = await self.f.r.metadata.get_ack_levels(group.queue, group.name)
        return json_response({"offsets": next_seqs(levels, plain), "start_ms": group.start_ms,
                              "type": group.config.type})  # fmt: skip

    async def post_offsets(self, request: web.Request) -> web.Response:
        group, plain = await self._group(request)
        if group.config.type != STREAM:
            raise InvalidRequest(
                f"group {group.name} is a {group.config.type} group; "
                "offsets can be committed for stream-mode groups only"
            )
        body = await decode(request, OffsetsBody, empty_ok=False)
        unknown = sorted(set(body.offsets) - plain)
        if unknown:
            raise InvalidRequest(f"not a plain extent of queue {group.queue}: {', '.join(unknown)}")
        metadata = self.f.r.metadata
        # one writer at a time per group, so two commits cannot interleave and move a level back
        lock = self._locks.get((group.queue, group.name))
        if lock is None:
            lock = self._locks[group.queue, group.name] = asyncio.Lock()
        async with lock:
            current = {a.extent: a for a in await metadata.get_ack_levels(group.queue, group.name)}
            rows = advance(current, body.offsets, group.queue, group.name)
            if rows:
                await metadata.put_ack_levels(rows)
        current.update({a.extent: a for a in rows})
        return json_response({"offsets": next_seqs(list(current.values()), plain),
                              "advanced": len(rows)})  # fmt: skip


def add_stream_group_routes(app: web.Application, frontend: Frontend) -> None:
    """Registered by build_app."""
    routes = StreamGroupRoutes(frontend)
    q = "/v1/queues/{queue}"
    app.add_routes([
        web.get(q + "/extents", routes.list_extents),
        web.get(q + "/groups/{group}/offsets", routes.get_offsets),
        web.post(q + "/groups/{group}/offsets", routes.post_offsets),
    ])  # fmt: skip
