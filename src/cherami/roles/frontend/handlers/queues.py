"""Queues: create, list, show (with stats), change and delete."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from cherami.httpbase import decode, json_response
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    FAILING,
    OPEN,
    SEALED,
    Queue,
    QueueConfig,
    QueuePatch,
    check_name,
)
from cherami.roles.controller.client import ControllerClient
from cherami.roles.frontend import schemas as s
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import rfc3339
from cherami.roles.frontend.paging import page_answer, page_asked
from cherami.roles.frontend.throttle import Throttle
from cherami.roles.outputhost.client import DELETED_CLOSE, MOVED_CLOSE, OutputHostClient
from cherami.roles.storehost.directory import StoreDirectory


def queue_json(queue: Queue) -> dict[str, Any]:
    return {
        "name": queue.name,
        **msgspec.to_builtins(queue.config),
        "created_at": rfc3339(int(queue.created_at * 1000)),
    }


class QueueHandlers:
    def __init__(
        self,
        lookup: Lookup,
        metadata: MetadataStore,
        controller: ControllerClient,
        stores: StoreDirectory,
        outputs: OutputHostClient | None,
        throttle: Throttle,
    ) -> None:
        self.lookup = lookup
        self.metadata = metadata
        self.controller = controller
        self.stores = stores
        self.outputs = outputs
        self.throttle = throttle

    async def put_queue(self, request: web.Request) -> web.Response:
        name = check_name("queue", request.match_info["queue"])
        self.lookup.auth(request, "admin", name)
        config = await decode(request, QueueConfig)
        queue, created = await self.controller.create_queue(name, config)
        return json_response(queue_json(queue), 201 if created else 200)

    async def list_queues(self, request: web.Request) -> web.Response:
        """A page of the queues by name (the groups' DLQs are not listed)."""
        self.lookup.auth(request, None, None)
        page = page_asked(request)
        queues = await self.metadata.list_queues(
            page.prefix, page.after, page.limit + 1, dlqs=False
        )
        return json_response(page_answer("queues", queues, page, queue_json))

    async def get_queue(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, None)
        extents = await self.metadata.list_extents(queue.name, (OPEN, FAILING, SEALED))
        published = stored = 0
        for extent in extents:
            info = await self.stores.info(extent)
            published += info.last_seq
            stored += info.bytes
        stats = s.QueueStats(
            messages_published=published,
            open_extents=sum(e.status in (OPEN, FAILING) for e in extents),
            sealed_extents=sum(e.status == SEALED for e in extents),
            bytes_stored=stored,
            unconsumed_bytes=await self.throttle.backlog_bytes(queue.name),
        )
        return json_response({**queue_json(queue), "stats": stats})

    async def patch_queue(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "admin")
        patch = await decode(request, QueuePatch)
        config = msgspec.structs.replace(
            queue.config,
            **{k: v for k, v in msgspec.structs.asdict(patch).items() if v is not None},
        )
        queue.config = config
        await self.controller.update_queue(queue)
        if self.outputs is not None:
            self.outputs.update_queue(queue)
        return json_response(queue_json(queue))

    async def delete_queue(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "admin")
        contents_only = request.query.get("contents_only", "false").lower() in ("1", "true", "yes")
        if self.outputs is not None:
            # emptied: groups reload from the new ack levels (their streams reconnect);
            # deleted: their streams are closed for good
            code = MOVED_CLOSE if contents_only else DELETED_CLOSE
            await self.outputs.unload(queue.name, close_code=code)
        await self.controller.delete_queue(queue.name, contents_only=contents_only)
        return web.Response(status=204)
