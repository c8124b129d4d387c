"""A group's dead-letter queue: browse, merge back into the group, purge."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from cherami.errors import InvalidRequest
from cherami.httpbase import json_response
from cherami.roles.controller.client import ControllerClient
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import body_fields, rfc3339
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.records import decode_record, expired


class DlqHandlers:
    def __init__(
        self, lookup: Lookup, controller: ControllerClient, stores: StoreDirectory
    ) -> None:
        self.lookup = lookup
        self.controller = controller
        self.stores = stores

    async def dlq_browse(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, "consume")
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            raise InvalidRequest("limit must be an integer") from None
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be from 1 to 1000")
        messages: list[dict[str, Any]] = []
        depth = 0
        now_ms = time.time() * 1000
        for extent, level, last_seq in await self.controller.dlq_ranges(group.dlq):
            depth += max(0, last_seq - level.acked)
            if len(messages) >= limit or last_seq <= level.acked:
                continue
            batch = await self.stores.read(extent, level.level, limit - len(messages))
            for raw in batch.records:
                record = decode_record(raw)
                if expired(record, now_ms):  # never delivered again: not shown
                    continue
                messages.append({
                    "id": record.orig_id or "",
                    **body_fields(record.body, record.text),
                    "attributes": record.attributes or {},
                    "enqueued_at": rfc3339(record.enqueued_ms),
                    **({"key": record.key} if record.key is not None else {}),
                    **({} if record.expires_ms is None
                       else {"expires_at": rfc3339(record.expires_ms)}),
                })  # fmt: skip
        return json_response({"messages": messages, "depth": depth})

    async def dlq_merge(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, "admin")
        merged = await self.controller.move_dlq_cursor(group.dlq, group)
        return json_response({"merged": merged})

    async def dlq_purge(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, "admin")
        purged = await self.controller.move_dlq_cursor(group.dlq, None)
        return json_response({"purged": purged})
