"""Consumer groups: create, list, show (with stats over the output hosts that hold
the group), change and delete."""

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
    STREAM,
    Group,
    GroupConfig,
    GroupPatch,
    check_name,
)
from cherami.roles.controller.client import ControllerClient
from cherami.roles.frontend import schemas as s
from cherami.roles.frontend.consumerrouting import ConsumerRouting
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import rfc3339
from cherami.roles.frontend.lag import stream_lag
from cherami.roles.frontend.paging import page_answer, page_asked
from cherami.roles.outputhost.client import OutputHostClient
from cherami.roles.storehost.directory import StoreDirectory


def group_json(group: Group) -> dict[str, Any]:
    return {
        "queue": group.queue,
        "name": group.name,
        **msgspec.to_builtins(group.config),
        "created_at": rfc3339(int(group.created_at * 1000)),
    }


class GroupHandlers:
    def __init__(
        self,
        lookup: Lookup,
        metadata: MetadataStore,
        controller: ControllerClient,
        stores: StoreDirectory,
        outputs: OutputHostClient | None,
        routing: ConsumerRouting,
    ) -> None:
        self.lookup = lookup
        self.metadata = metadata
        self.controller = controller
        self.stores = stores
        self.outputs = outputs
        self.routing = routing

    async def put_group(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "admin")
        name = check_name("group", request.match_info["group"])
        config = await decode(request, GroupConfig)
        group, created = await self.controller.create_group(queue, name, config)
        if self.outputs is not None:  # a node loads it at its first consumer
            await self.outputs.made(group, created)
        return json_response(group_json(group), 201 if created else 200)

    async def list_groups(self, request: web.Request) -> web.Response:
        """A page of the queue's groups by name."""
        queue = await self.lookup.queue(request, None)
        page = page_asked(request)
        groups = await self.metadata.list_groups(
            queue.name, page.prefix, page.after, page.limit + 1
        )
        return json_response(page_answer("groups", groups, page, group_json))

    async def get_group(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, None)
        stats = await self.routing.stats(
            request, group, lambda: self._group_stats(group), lambda: self._group_stats(group, True)
        )
        served = await self.outputs.served(group.queue, group.name) if self.outputs else None
        body = {**group_json(served or group), "stats": stats}
        if group.config.type == STREAM:
            body["lag"] = (await stream_lag(self.metadata, self.stores, group)).json()
        return json_response(body)

    async def _group_stats(self, group: Group, persisted: bool = False) -> s.GroupStats:
        """The stats of the extents this process serves; with none, nothing, or with
        ``persisted`` the group's backlog by its persisted ack levels."""
        ranges = await self.controller.dlq_ranges(group.dlq)
        dlq_depth = sum(max(0, last - level.acked) for _, level, last in ranges)
        state = None if self.outputs is None else await self.outputs.state(group)
        if state is None:
            return await self._persisted_stats(group, dlq_depth, persisted)
        return s.GroupStats(
            backlog=state.backlog,
            in_flight=state.in_flight,
            dlq_depth=dlq_depth,
            oldest_unacked_age_seconds=state.oldest_unacked_age_seconds,
            delivered=state.delivered,
            acked=state.acked,
            redelivered=state.redelivered,
            top_keys=[s.KeyBacklog(k, n) for k, n in state.top_keys],
            expired=state.expired,
            cancelled=state.cancelled,
        )

    async def _persisted_stats(self, group: Group, dlq_depth: int, read: bool) -> s.GroupStats:
        rows = await self.metadata.get_ack_levels(group.queue, group.name) if read else []
        levels = {a.extent: a.acked for a in rows}
        backlog = 0
        extents = await self.metadata.list_extents(group.queue, (OPEN, FAILING, SEALED))
        for extent in extents if read else []:
            info = await self.stores.info(extent)
            backlog += max(0, info.count - levels.get(extent.id, 0))
        return s.GroupStats(
            backlog=backlog, in_flight=0, dlq_depth=dlq_depth, oldest_unacked_age_seconds=0.0,
            delivered=0, acked=0, redelivered=0,
        )  # fmt: skip

    async def patch_group(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, "admin")
        patch = await decode(request, GroupPatch)
        group.config = msgspec.structs.replace(
            group.config,
            **{k: v for k, v in msgspec.structs.asdict(patch).items() if v is not None},
        )
        await self.metadata.update_group(group)
        if self.outputs is not None:
            self.outputs.update_group(group)
        return json_response(group_json(group))

    async def delete_group(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "admin")
        name = check_name("group", request.match_info["group"])
        await self.metadata.get_group(queue.name, name)
        if self.outputs is not None:
            await self.outputs.unload(queue.name, name)
        await self.controller.delete_group(queue.name, name)
        return web.Response(status=204)
