"""Cherami's routing call, ``GET /v1/queues/{queue}/publishers``: the live input hosts
that hold a queue's open extents, so that a streaming producer publishes to each of
them directly instead of through one frontend to one input host (docs/protocol.md,
"Publishing to several input hosts")."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cherami.httpbase import json_response
from cherami.membership import INPUTHOST
from cherami.metadata.models import OPEN
from cherami.roles.frontend.context import Frontend
from cherami.wire.store import PLAIN

REFRESH_SECONDS = 10  # how often a producer should ask again


class RoutingRoutes:
    def __init__(self, frontend: Frontend) -> None:
        self.f = frontend

    async def publishers(self, request: web.Request) -> web.Response:
        queue = await self.f.queue(request, "produce")
        return json_response({
            "queue": queue.name,
            "input_hosts": await self._input_hosts(queue.name),
            "refresh_seconds": REFRESH_SECONDS,
        })  # fmt: skip

    async def _input_hosts(self, queue: str) -> list[dict[str, Any]]:
        """Each live input host with an open plain extent of the queue (every such host
        has the queue's timer extent too), by its advertised address. Empty where one
        process serves every queue (a single node): publish through the URL in use."""
        r = self.f.r
        if r.router is None:
            return []
        live = {h.id: h.address for h in await r.router.live(INPUTHOST)}
        extents = await r.metadata.list_extents(queue, (OPEN,))
        held: dict[str, list[str]] = {}
        for extent in sorted(extents, key=lambda e: (e.created_at, e.id)):
            if extent.kind == PLAIN and extent.input_host in live:
                held.setdefault(live[extent.input_host], []).append(extent.id)
        return [{"address": address, "extents": ids} for address, ids in sorted(held.items())]


def add_routing_routes(app: web.Application, frontend: Frontend) -> None:
    """Registered by build_app."""
    app.router.add_get("/v1/queues/{queue}/publishers", RoutingRoutes(frontend).publishers)
