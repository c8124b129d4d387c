"""How the other roles reach the controller. The frontend asks it for queues, groups and
dead-letter ranges (``ControllerClient``): every API process of a cluster runs a
ControllerService over the shared metadata store (only the leading controller's process
opens and seals extents: ``manage_extents``), so the in-process service is the one
implementation; a node's is the same. An input host reports a failed extent through the
metadata store (``report_failing``); the leading controller (leader.py) acts on it. A
group's dead-letter queue holds no extent until the output host moves its first message
there (``wake_dead_letter_queue``, also through the metadata store), and a queue holds no
timer extent until its first delayed message (``want_timers``); an AP queue is marked
keyed before its first keyed message is written (``want_keyed``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    FAILING,
    OPEN,
    AckLevel,
    Extent,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
    min_plain,
)


class ControllerClient(Protocol):
    @property
    def manage_extents(self) -> bool:
        """Whether this process opens and seals extents (it reports the queues' extents)."""
        ...

    async def create_queue(self, name: str, config: QueueConfig) -> tuple[Queue, bool]: ...

    async def update_queue(self, queue: Queue) -> None: ...

    async def delete_queue(self, name: str, contents_only: bool = False) -> None: ...

    @property
    def deleted(self) -> list[Callable[[str], None]]:
        """Told the name of each queue it deletes (a group's dead-letter queue too): what
        this process keeps per queue forgets it."""
        ...

    async def create_group(
        self, queue: Queue, name: str, config: GroupConfig
    ) -> tuple[Group, bool]:
        """Make the queue's group (``queue``: the record the caller has just read) and
        its dead-letter queue; whether it was made now (False: it was there, with the
        same config)."""
        ...

    async def delete_group(self, queue: str, name: str) -> None: ...

    async def dlq_ranges(self, dlq: str) -> list[tuple[Extent, AckLevel, int]]:
        """Each extent of a dead-letter queue with its cursor and last sequence number."""
        ...

    async def move_dlq_cursor(
        self, dlq: str, merge_into: Group | None, most: int | None = None
    ) -> int:
        """Purge the dead-letter queue (None), or merge it into the group: all of it,
        or its oldest ``most`` messages."""
        ...


async def report_failing(metadata: MetadataStore, extent_id: str) -> None:
    """A replica failed under its input host: the leading controller seals the extent
    and opens what the queue needs (unless it is sealing it already, e.g. to scale the
    queue down)."""
    extent = await metadata.get_extent(extent_id)
    if extent is not None and extent.status == OPEN:
        await metadata.set_extent_status(extent_id, FAILING)


async def want_timers(metadata: MetadataStore, queue: Queue) -> None:
    """An input host took a delayed message for a queue that keeps no timer extent (it
    has none until its first one): the leading controller sees the change in the change
    log and opens one beside each of the queue's plain extents at its next tick, and the
    publish waits for it meanwhile, as when an extent is replaced."""
    if queue.dlq_of is None and not queue.timers:
        await metadata.mark_queue(queue.name, "timers")
        queue.timers = True


async def want_keyed(metadata: MetadataStore, queue: Queue) -> None:
    """An input host takes a keyed message for an AP queue not marked keyed yet: mark
    it before writing the message, so that in a cluster each of its groups is served
    whole by one output host (a CP queue's always is). Output hosts see the change in
    the change log; one holding a group's extents one by one meanwhile holds its keyed
    messages back (docs/design/ordering-keys.md, "A cluster")."""
    if queue.config.type != "cp" and not queue.keyed:
        await metadata.mark_queue(queue.name, "keyed")
        queue.keyed = True


async def wake_dead_letter_queue(metadata: MetadataStore, dlq: str) -> Queue:
    """The dead-letter queue, asked to keep an open extent from now on (made with
    ``min_extents`` 0, it holds none until its first dead letter): the leading
    controller sees the change in the change log and opens one at its next tick, and a
    publish to the queue waits for it meanwhile, as when an extent is replaced."""
    queue = await metadata.get_queue(dlq)
    if queue.dlq_of is not None and min_plain(queue) == 0:
        queue.config.min_extents = 1
        await metadata.update_queue(queue)
    return queue
