"""Riding out a metadata outage: an output host goes on delivering and settling the extents
it holds while the metadata store is unreachable *for every output host*, and stops at
its leases' end as before when only it is cut off.

A host cannot tell those two apart by itself, so it asks its peers: every output host
that was alive at its last successful read of the hosts table. When each of them answers
that it cannot reach the store either, nobody can take a lease now, and nobody will for
``timing.recovery_grace`` after it reaches the store again (ownership.py: after a failed or
slow tick a host only renews its own leases for that long, and a host that starts waits
that long before it takes anything). So the asker may act for that long from the moment
it asked, less the lease margin for clock drift: it extends the acting window of every
unit whose window has not run out yet (a unit whose window ran out may have been taken
while this host was cut off), and asks again every tick. A peer that does not answer,
answers late, or can reach the store ends it: the host then stops at the end of its
window, as the fencing rule says. So does a host with no peer to ask (a cluster's only
output host).

While it rides an outage out, ack levels and parked rows wait in memory (the output host
does not try to write them) and are written with the lease's epoch when the store
answers again; an ack answered meanwhile is lost only if this host dies before then, and
then its message is delivered again (at least once, never lost)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import aiohttp
from aiohttp import web

from cherami.context import ProcessContext
from cherami.errors import Unauthorized
from cherami.periodic import Periodic
from cherami.wire import handshake as h

log = logging.getLogger("cherami.outputhost.outage")

ROUTE = "/internal/v1/outputhost/metadata"


class Riding(Protocol):
    """What the watch needs of ExtentOwnership."""

    peers: dict[str, str]  # host id -> address of the other live output hosts
    clock: Callable[[], float]  # monotonic seconds, as the acting windows are timed

    def store_unreachable(self) -> bool: ...

    def ride_out(self, until: float) -> int: ...


class OutageWatch:
    def __init__(self, owner: Riding, ctx: ProcessContext) -> None:
        """Times by ``owner.clock``; ``ctx``: the timing, the key and TLS to ask with."""
        self.owner = owner
        self.ctx = ctx
        self._session: aiohttp.ClientSession | None = None
        tick = ctx.timing.ownership_tick
        self._periodic = Periodic("metadata outage watch", tick, self.check)
        self.riding = False

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
        if self._session is not None:
            await self._session.close()

    async def check(self) -> None:
        if not self.owner.store_unreachable():
            if self.riding:
                log.info("metadata store reachable again: acting by lease")
            self.riding = False
            return
        asked = self.owner.clock()
        peers = dict(self.owner.peers)
        answers = await asyncio.gather(*(self._ask(a) for a in peers.values()))
        # alone, a host cannot tell an outage from being cut off (a host started to
        # replace it, which reaches the store, would take its extents): it stops
        units = 0
        if peers and all(answers) and self.owner.store_unreachable():
            units = self.owner.ride_out(
                asked + self.ctx.timing.recovery_grace - self.ctx.timing.lease_margin
            )
        # every window may have run out before the peers answered (the store went away
        # while this host was cut off too, or a peer's tick was merely slow): then there
        # is nothing to act on, and nothing is said
        if units:
            if not self.riding:
                log.warning("metadata store unreachable from every output host (%d peers): "
                            "acting on for %d extents", len(peers), units)  # fmt: skip
            self.riding = True
        elif self.riding:
            cut = sorted(p for p, ok in zip(peers, answers, strict=True) if not ok)
            if cut:
                log.warning("metadata outage: peers %s reach the store or do not answer: "
                            "acting stops with the leases", cut)  # fmt: skip
            else:
                log.warning("metadata outage: no extent left to act for")
            self.riding = False

    async def _ask(self, address: str) -> bool:
        """Whether the peer at ``address`` says it cannot reach the store."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ctx.tls_client or False)
            )
        url = f"{self.ctx.http_scheme}://{address}{ROUTE}"
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=self.ctx.timing.outage_ask_timeout),
                headers=self.ctx.internal_headers(),
            ) as resp:  # fmt: skip
                if resp.status != 200:
                    return False
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        return body.get("store_unreachable") is True


def add_outage_route(
    app: web.Application, unreachable: Callable[[], bool], ctx: ProcessContext
) -> None:
    """The route peers ask (internal token only)."""

    async def handler(request: web.Request) -> web.Response:
        if not ctx.internal_ok(request.headers.get(h.INTERNAL_HEADER)):
            raise Unauthorized("internal route: the cluster's internal token is required")
        return web.json_response({"store_unreachable": unreachable()})

    app.router.add_get(ROUTE, handler)
