"""Health, metrics, the OpenAPI document and the cluster view."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from cherami.errors import CheramiError
from cherami.httpbase import json_response
from cherami.loadmeter import has_room
from cherami.membership import STOREHOST, live_hosts
from cherami.metadata.base import MetadataStore
from cherami.roles.frontend.clusterview import cluster_json
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.openapi import openapi_document

Scrape = Callable[[], Awaitable[tuple[bytes, str]]]  # the metrics body and its content type


class OpsHandlers:
    def __init__(
        self, lookup: Lookup, metadata: MetadataStore, ready: Callable[[], bool], scrape: Scrape
    ) -> None:
        self.lookup = lookup
        self.dead_after = lookup.ctx.timing.dead_after
        self.metadata = metadata
        self.ready = ready
        self.scrape = scrape

    async def healthz(self, request: web.Request) -> web.Response:
        """200 ``ok``; 200 ``degraded`` with the store hosts below their free-disk floor
        (publishes to their extents answer 429 storage_full; the rest goes on); 503
        ``starting``."""
        if not self.ready():
            return json_response({"status": "starting"}, 503)
        try:
            stores = await live_hosts(self.metadata, STOREHOST, self.dead_after)
        except CheramiError:
            return json_response({"status": "ok"})  # the metadata store's health is its own
        full = sorted(h.id for h in stores if not has_room(h))
        if full:
            return json_response({"status": "degraded", "storage_full": full})
        return json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        self.lookup.auth(request, None, None)
        body, content_type = await self.scrape()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document())

    async def cluster(self, request: web.Request) -> web.Response:
        self.lookup.auth(request, None, None)
        return json_response(await cluster_json(self.metadata, self.dead_after))
