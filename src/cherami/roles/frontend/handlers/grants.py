"""Read grants: ``POST /v1/queues/{queue}/read-grants`` lets a caller whose API key may
consume a queue read the queue's extents straight from the store hosts without the
cluster secret (docs/api.md, "Read grants"; the grant itself: wire/grants.py). One grant
per extent, read-only, expiring, signed with the cluster key this process holds."""

from __future__ import annotations

import time

from aiohttp import web

from cherami.errors import InvalidRequest
from cherami.httpbase import decode, json_response
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import DELETED
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import rfc3339
from cherami.roles.frontend.schemas import ReadGrantOut, ReadGrantsBody, ReadGrantsResponse
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire import grants


class GrantHandlers:
    def __init__(self, lookup: Lookup, metadata: MetadataStore, stores: StoreDirectory) -> None:
        self.lookup = lookup
        self.metadata = metadata
        self.stores = stores  # its key: the cluster key the store hosts check

    async def read_grants(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "consume")
        body = await decode(request, ReadGrantsBody)
        held = {e.id for e in await self.metadata.list_extents(queue.name) if e.status != DELETED}
        asked = list(dict.fromkeys(body.extents)) or sorted(held)
        others = [e for e in asked if e not in held]
        if others:
            raise InvalidRequest(f"not an extent of queue {queue.name}: {', '.join(others[:10])}")
        now = time.time()
        key = self.stores.key
        issued = [
            grants.issue(key, queue.name, [extent], body.lifetime_seconds, now) for extent in asked
        ]
        return json_response(ReadGrantsResponse(
            queue=queue.name,
            expires_at=rfc3339(int((now + body.lifetime_seconds) * 1000)),
            lifetime_seconds=body.lifetime_seconds,
            grants=[ReadGrantOut(e, g.token, g.key) for e, g in zip(asked, issued, strict=True)],
        ))  # fmt: skip
