"""The Cherami side of the SQS endpoint: an SQS queue is a Cherami queue read through
one group named ``sqs``. Reached as the frontend's handlers reach it: the roles'
clients of this process (a node's, or a cluster process's own), the input host of a
cluster over its internal publish route, and a group's output hosts through the
frontend's router (cluster.py)."""

from __future__ import annotations

from dataclasses import dataclass

from cherami.errors import GroupNotFound, QueueNotFound
from cherami.metadata.models import (
    FAILING,
    OPEN,
    SEALED,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
)
from cherami.roles.frontend.auth import ApiKey
from cherami.roles.frontend.context import Roles
from cherami.roles.frontend.sqs.cluster import RemoteGroups
from cherami.roles.frontend.sqs.model import Delivery
from cherami.roles.frontend.throttle import Throttle
from cherami.roles.inputhost.client import RemoteInputHost
from cherami.roles.outputhost.client import Settlement
from cherami.wire.records import Message, Record, decode_record

SQS_GROUP = "sqs"


@dataclass(frozen=True)
class Counts:
    visible: int  # ApproximateNumberOfMessages
    in_flight: int  # ApproximateNumberOfMessagesNotVisible
    dead_lettered: int  # in the group's DLQ


class Backend:
    def __init__(self, roles: Roles) -> None:
        self.r = roles
        self.throttle = Throttle(
            roles.metadata, roles.stores, roles.inputs.host_id if roles.inputs else None,
            roles.metrics.refused,
        )  # fmt: skip
        router = roles.router
        self._remote_inputs = (
            None
            if router is None
            else RemoteInputHost(router.input_host, lambda: router.session, roles.ctx)
        )
        self._remote_groups = None if router is None else RemoteGroups(roles, router)

    # queues
    async def group(self, name: str) -> Group:
        try:
            return await self.r.metadata.get_group(name, SQS_GROUP)
        except GroupNotFound:
            raise QueueNotFound(f"no SQS queue {name}") from None

    async def find(self, name: str) -> tuple[Queue, Group] | None:
        """The queue and its ``sqs`` group; None when it is not an SQS queue."""
        try:
            queue = await self.r.metadata.get_queue(name)
            return queue, await self.group(name)
        except QueueNotFound:
            return None

    async def create(self, name: str, config: QueueConfig, group: GroupConfig) -> Group:
        queue, _ = await self.r.controller.create_queue(name, config)
        made, created = await self.r.controller.create_group(queue, SQS_GROUP, group)
        if self.r.outputs is not None:
            await self.r.outputs.made(made, created)
        return made

    async def names(self, prefix: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` SQS queues' names after ``after``, by name."""
        names: list[str] = []
        while len(names) < limit:
            page = await self.r.metadata.list_queues(prefix, after, 200, dlqs=False)
            for queue in page:
                if await self.find(queue.name) is not None:
                    names.append(queue.name)
            if len(page) < 200:
                break
            after = page[-1].name
        return names[:limit]

    async def update(self, queue: Queue, group: Group) -> None:
        await self.r.controller.update_queue(queue)
        await self.r.metadata.update_group(group)
        if self.r.outputs is not None:
            self.r.outputs.update_queue(queue)
            self.r.outputs.update_group(group)

    async def delete(self, name: str, contents_only: bool = False) -> None:
        if self.r.outputs is not None:
            await self.r.outputs.unload(name)
        await self.r.controller.delete_queue(name, contents_only=contents_only)

    async def dead_lettered(self, group: Group) -> int:
        """The messages in the group's DLQ (not merged back or purged)."""
        return (await self.dlq_position(group))[0]

    async def dlq_position(self, group: Group) -> tuple[int, int]:
        """The messages in the group's DLQ, and those its cursor has passed (merged
        back or purged): a move's progress, as durable as the merges."""
        ranges = await self.r.controller.dlq_ranges(group.dlq)
        left = sum(max(0, last - level.acked) for _, level, last in ranges)
        return left, sum(level.acked for _, level, _ in ranges)

    async def counts(self, group: Group) -> Counts:
        dead = await self.dead_lettered(group)
        outputs = self.r.outputs
        state = None
        if outputs is not None and outputs.owns(group.queue, group.name):
            state = await outputs.state(group)
        if state is not None:
            return Counts(state.backlog - state.in_flight, state.in_flight, dead)
        if self._remote_groups is not None:
            backlog, in_flight = await self._remote_groups.counts(group)
            if backlog is not None:
                return Counts(backlog - in_flight, in_flight, dead)
        return Counts(await self._persisted_backlog(group), 0, dead)

    async def _persisted_backlog(self, group: Group) -> int:
        rows = await self.r.metadata.get_ack_levels(group.queue, group.name)
        levels = {a.extent: a.acked for a in rows}
        backlog = 0
        for extent in await self.r.metadata.list_extents(group.queue, (OPEN, FAILING, SEALED)):
            info = await self.r.stores.info(extent)
            backlog += max(0, info.count - levels.get(extent.id, 0))
        return backlog

    async def merge_dlq(self, group: Group, most: int | None = None) -> int:
        """Merge the group's DLQ back into it (its oldest ``most`` messages): how many."""
        return await self.r.controller.move_dlq_cursor(group.dlq, group, most)

    async def purge_dlq(self, group: Group, most: int | None = None) -> int:
        """Drop the group's DLQ (its oldest ``most`` messages): how many."""
        return await self.r.controller.move_dlq_cursor(group.dlq, None, most)

    async def read_dlq(self, group: Group, most: int) -> list[Record]:
        """Up to the oldest ``most`` messages of the group's DLQ: those a purge of as
        many drops (an extent is read past only when it was read to its end)."""
        out: list[Record] = []
        for extent, level, last_seq in await self.r.controller.dlq_ranges(group.dlq):
            wanted = min(most - len(out), last_seq - level.acked)
            if wanted <= 0:
                if len(out) >= most:
                    break
                continue
            batch = await self.r.stores.read(extent, level.level, wanted)
            out += [decode_record(raw) for raw in batch.records[:wanted]]
            if len(batch.records) < wanted:
                break
        return out

    # messages
    async def publish(self, queue: Queue, messages: list[Message], key: ApiKey | None) -> list[str]:
        size = sum(len(m.body) for m in messages)
        inputs = self.r.inputs
        if inputs is not None and await inputs.serves(queue.name):
            await self.throttle.admit(queue, key, len(messages), size, fresh=True)
            ids = await inputs.publish(queue, messages)
        elif self._remote_inputs is not None:  # the internal route applies no limits
            await self.throttle.admit(queue, key, len(messages), size, fresh=True)
            ids = await self._remote_inputs.publish(queue, messages)
        else:
            raise QueueNotFound(f"no input host serves queue {queue.name}")
        self.r.metrics.published(queue.name, len(ids), 0.0)
        return ids

    async def receive(
        self, group: Group, max_messages: int, wait: float, visibility: float | None
    ) -> list[Delivery]:
        outputs = self.r.outputs
        if self._remote_groups is not None:
            return await self._remote_groups.receive(group, max_messages, wait, visibility)
        if outputs is None:
            return []
        taken = await outputs.receive(group, max_messages, wait, visibility)
        return [
            Delivery(e.msg_id, receipt, e.record.body, e.record.attributes or {}, e.count,
                     e.record.enqueued_ms)
            for e, receipt in taken
        ]  # fmt: skip

    async def settle(
        self, group: Group, receipts: list[str], how: Settlement
    ) -> tuple[int, list[str]]:
        durable = how.kind != "extend"
        if self._remote_groups is not None:
            return await self._remote_groups.settle(group, receipts, how, durable)
        if self.r.outputs is None:
            return 0, receipts
        return await self.r.outputs.settle(group, receipts, how, durable)
