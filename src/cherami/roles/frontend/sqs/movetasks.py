"""SQS's message move tasks over Cherami's DLQ merge (docs/sqs.md, "Redrive").

A task moves what the source queues dead-lettered to an SQS dead-letter queue back to
them: each source's ``sqs`` group merges its own DLQ (the controller's DLQ cursor).
Without ``MaxNumberOfMessagesPerSecond`` that is one merge, done before the start
answers. With it the task merges that many messages a second, oldest first, until it
has moved as many as its source held when it started (or is cancelled).

Tasks are properties of the dead-letter queue in the metadata store, so every frontend
lists the same ones and they outlive the process that started them:

| property | value |
|---|---|
| ``sqs.task.<started ms>.<id>`` | the task (JSON), the newest 10 kept |
| ``sqs.moving`` | the key of the queue's running task (one at a time, as on SQS) |
| ``sqs.cancel`` | the key of a running task asked to stop |

A running task is run by the frontend that holds the lease ``sqs-move:<queue>`` (renewed
at every step, released when the task ends; the holder is the process's host id, which
survives a restart). A frontend that starts, and one that lists or cancels a running
task, watches it: when its runner stops (a crash, a restart), the first of them to take
the lease goes on from the last step written, so a task resumes after a restart rather
than failing. Only the watched tasks cost anything: nothing looks at an idle queue."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from typing import Any

import msgspec

from cherami.errors import CheramiError, MessageTooLarge, QueueNotFound
from cherami.metadata.models import Group, Queue
from cherami.roles.frontend.sqs.backend import Backend
from cherami.wire.records import Message

log = logging.getLogger("cherami.frontend.sqs")

TASK, MOVING, CANCEL = "sqs.task.", "sqs.moving", "sqs.cancel"
COPY_STEP = 100  # messages a step copies to a destination without a rate
PUBLISH_BYTES = 4 << 20  # a copy publishes up to this much at a time
KEEP = 10  # tasks remembered per queue (SQS lists the last 10)
LEASE_SECONDS = 10.0
STEP_SECONDS = 1.0  # a rated task merges its rate's worth of messages this often
RUNNING, COMPLETED, CANCELLING, CANCELLED, FAILED = (
    "RUNNING", "COMPLETED", "CANCELLING", "CANCELLED", "FAILED",
)  # fmt: skip


class MoveTask(msgspec.Struct, kw_only=True, omit_defaults=True):
    key: str  # "<started ms, 13 digits>.<id>": the property's name after TASK
    source_arn: str
    sources: list[str]  # the queues whose groups' DLQs it merges back
    started_ms: int
    status: str = RUNNING
    destination_arn: str | None = None
    destination: str | None = None  # a queue that is not a source: copied there, dropped
    rate: int | None = None
    to_move: int = 0
    moved: int = 0
    passed: int = 0  # the sources' DLQ cursors at the start, summed (dlq_position)
    failure: str | None = None


def handle_of(queue: str, key: str) -> str:
    raw = json.dumps({"queue": queue, "task": key}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def parse_handle(handle: Any) -> tuple[str, str] | None:
    """The (dead-letter queue, task key) a handle names; None for one this endpoint
    could not have issued."""
    if not isinstance(handle, str) or not handle or len(handle) > 1024:
        return None
    try:
        named = json.loads(base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)))
        queue, key = named["queue"], named["task"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        return None
    return (queue, key) if isinstance(queue, str) and isinstance(key, str) else None


def as_sqs(queue: str, task: MoveTask, cancelling: bool) -> dict[str, Any]:
    """A ListMessageMoveTasksResultEntry."""
    status = CANCELLING if cancelling and task.status == RUNNING else task.status
    out: dict[str, Any] = {
        "Status": status, "SourceArn": task.source_arn,
        "ApproximateNumberOfMessagesMoved": task.moved,
        "ApproximateNumberOfMessagesToMove": task.to_move,
        "StartedTimestamp": task.started_ms,
    }  # fmt: skip
    if status in (RUNNING, CANCELLING):
        out["TaskHandle"] = handle_of(queue, task.key)
    if task.destination_arn:
        out["DestinationArn"] = task.destination_arn
    if task.rate:
        out["MaxNumberOfMessagesPerSecond"] = task.rate
    if task.failure:
        out["FailureReason"] = task.failure
    return out


class MoveTasks:
    def __init__(
        self, backend: Backend, holder: str, step_seconds: float = STEP_SECONDS,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.metadata = backend.r.metadata
        self.holder = holder
        self.step_seconds = step_seconds
        self.lease_seconds = lease_seconds
        self._runners: dict[str, asyncio.Task[None]] = {}  # by dead-letter queue
        self._wake: dict[str, asyncio.Event] = {}  # a runner's pause, cut short (a cancel)
        self._stop = asyncio.Event()
        self._starting = asyncio.Lock()

    async def tasks(self, queue: str) -> tuple[list[MoveTask], dict[str, str]]:
        """The queue's tasks, newest first, and its task properties."""
        props = await self.metadata.get_queue_properties(queue, "sqs.")
        tasks = [msgspec.json.decode(v, type=MoveTask) for k, v in props.items()
                 if k.startswith(TASK)]  # fmt: skip
        return tasks[::-1], props

    async def running(self, queue: str) -> MoveTask | None:
        return (await self._running(queue))[0]

    async def _write(self, queue: str, task: MoveTask, delete: list[str] | None = None) -> None:
        values = {TASK + task.key: msgspec.json.encode(task).decode()}
        if task.status == RUNNING:
            values[MOVING] = task.key
        await self.metadata.put_queue_properties(
            queue, values, delete if task.status == RUNNING else [MOVING, CANCEL, *(delete or [])]
        )

    async def start(
        self, queue: str, sources: list[Group], source_arn: str, destination_arn: str | None,
        rate: int | None, destination: str | None = None,
    ) -> str | None:  # fmt: skip
        """Start a task; ``destination``: a queue that is not one of the sources, which
        the messages are copied to (a running task, in steps of COPY_STEP without a
        rate) rather than merged back. None when a task of the queue is running, or
        starting on another frontend: its lease is taken first, so of two starts at
        once one is refused."""
        lease = f"sqs-move:{queue}"
        async with self._starting:  # two starts in this process: one after the other
            if await self.running(queue) is not None:
                return None
            if await self.metadata.try_lease(lease, self.holder, self.lease_seconds) is None:
                return None
            try:
                task = await self._start(queue, sources, source_arn, destination_arn, rate,
                                         destination)  # fmt: skip
            except BaseException:
                await self.metadata.try_lease(lease, self.holder, 0.0)
                raise
        if task.status == RUNNING:
            self.watch(queue)
        else:
            await self.metadata.try_lease(lease, self.holder, 0.0)
        return handle_of(queue, task.key)

    async def _start(
        self, queue: str, sources: list[Group], source_arn: str, destination_arn: str | None,
        rate: int | None, destination: str | None,
    ) -> MoveTask:  # fmt: skip
        now = int(time.time() * 1000)
        task = MoveTask(key=f"{now:013d}.{uuid.uuid4().hex[:12]}", source_arn=source_arn,
                        sources=[g.queue for g in sources], started_ms=now,
                        destination_arn=destination_arn, destination=destination,
                        rate=rate)  # fmt: skip
        for group in sources:
            left, passed = await self.backend.dlq_position(group)
            task.to_move, task.passed = task.to_move + left, task.passed + passed
        if (rate is None and destination is None) or task.to_move == 0:  # one merge, now
            for group in sources:
                task.moved += await self.backend.merge_dlq(group)
            task.status, task.to_move = COMPLETED, max(task.to_move, task.moved)
        tasks, _ = await self.tasks(queue)
        old = [TASK + t.key for t in tasks[KEEP - 1 :] if t.status != RUNNING]
        await self._write(queue, task, old)
        return task

    async def cancel(self, queue: str, key: str) -> MoveTask | None:
        """Ask the running task to stop (its runner marks it CANCELLED at its next
        step); None when it is not the queue's running task."""
        task = await self.running(queue)
        if task is None or task.key != key:
            return None
        await self.metadata.put_queue_properties(queue, {CANCEL: key})
        self.watch(queue)
        self._wake.setdefault(queue, asyncio.Event()).set()
        return task

    def watch(self, queue: str) -> None:
        """Run the queue's running task here, or take it over when its runner stops."""
        runner = self._runners.get(queue)
        if (runner is None or runner.done()) and not self._stop.is_set():
            self._runners[queue] = asyncio.create_task(self._run(queue))

    async def resume(self) -> None:
        """At start: watch every running task (one index read)."""
        for queue in await self.metadata.find_queue_properties(MOVING):
            self.watch(queue)

    async def close(self) -> None:
        """Stop the runners between steps: a step is never cut in two."""
        self._stop.set()
        for wake in self._wake.values():
            wake.set()
        await asyncio.gather(*self._runners.values(), return_exceptions=True)

    async def _pause(self, queue: str, seconds: float) -> bool:
        """Wait (less when woken); False when the endpoint is stopping."""
        wake = self._wake.setdefault(queue, asyncio.Event())
        if self._stop.is_set():
            return False
        try:
            await asyncio.wait_for(wake.wait(), seconds)
        except TimeoutError:
            pass
        wake.clear()
        return not self._stop.is_set()

    async def _run(self, queue: str) -> None:
        try:
            await self._loop(queue)
        finally:  # forget the queue (its task, when it runs again, starts another runner)
            if self._runners.get(queue) is asyncio.current_task():
                del self._runners[queue]
                self._wake.pop(queue, None)

    async def _loop(self, queue: str) -> None:
        while True:
            pause: float | None = self.step_seconds
            try:
                pause = await self._step(queue)
            except QueueNotFound:
                return  # the dead-letter queue was deleted, and its tasks with it
            except CheramiError as err:
                if err.status == 429 or err.status >= 500:  # for now (a host, the store)
                    log.warning("message move task on %s: %s; retrying", queue, err)
                else:
                    await self._fail(queue, f"{err.code}: {err}")
                    return
            except Exception:
                log.exception("message move task on %s failed", queue)
                await self._fail(queue, "InternalError")
                return
            if pause is None or not await self._pause(queue, pause):
                return

    async def _fail(self, queue: str, why: str) -> None:
        try:
            task = await self.running(queue)
            if task is not None:
                task.status, task.failure = FAILED, why
                await self._write(queue, task)
                await self.metadata.try_lease(f"sqs-move:{queue}", self.holder, 0.0)
        except CheramiError as err:  # left running: the next watcher tries again
            log.warning("message move task on %s: not marked failed (%s): %s", queue, why, err)

    async def _running(self, queue: str) -> tuple[MoveTask | None, dict[str, str]]:
        tasks, props = await self.tasks(queue)
        key = props.get(MOVING)
        return next((t for t in tasks if t.key == key and t.status == RUNNING), None), props

    async def _step(self, queue: str) -> float | None:
        """One step of the queue's running task: how long to wait before the next;
        None when there is none left to run here."""
        task, _ = await self._running(queue)
        if task is None:
            return None
        lease = f"sqs-move:{queue}"
        if await self.metadata.try_lease(lease, self.holder, self.lease_seconds) is None:
            return self.lease_seconds  # another frontend runs it: look when it would end
        task, props = await self._running(queue)  # as its last runner left it
        if task is None:
            return None
        if props.get(CANCEL) == task.key:
            task.status = CANCELLED
        else:
            await self._move(task)
        await self._write(queue, task)
        if task.status != RUNNING:  # let the next task start anywhere at once
            await self.metadata.try_lease(lease, self.holder, 0.0)
            return None
        return self.step_seconds if task.rate else 0.0

    async def _move(self, task: MoveTask) -> None:
        """Merge the task's rate's worth (or all that is left) from its sources. What
        it moved so far is read from the sources' DLQ cursors, not counted: a step cut
        short after its merge (a crash, an error) is neither lost nor done twice."""
        groups = [got[1] for name in task.sources if (got := await self.backend.find(name))]
        if not groups:
            task.status, task.failure = FAILED, "AWS.SimpleQueueService.NonExistentQueue"
            return
        left = passed = 0
        for group in groups:
            in_dlq, at = await self.backend.dlq_position(group)
            left, passed = left + in_dlq, passed + at
        task.moved = min(task.to_move, max(task.moved, passed - task.passed))
        step = min(task.to_move - task.moved, left,
                   task.rate or (COPY_STEP if task.destination else task.to_move))  # fmt: skip
        moved = 0
        if task.destination is not None:
            found = await self.backend.find(task.destination)
            if found is None:
                task.status, task.failure = FAILED, "AWS.SimpleQueueService.NonExistentQueue"
                return
            for group in groups:
                if moved < step:
                    moved += await self._copy(group, found[0], step - moved)
        else:
            for group in groups:
                if moved < step:
                    moved += await self.backend.merge_dlq(group, step - moved)
        task.moved += moved
        if moved == 0 or task.moved >= task.to_move:
            task.status = COMPLETED  # done, or what was left is gone (purged, deleted)

    async def _copy(self, group: Group, destination: Queue, most: int) -> int:
        """Publish the oldest ``most`` messages of the group's DLQ to ``destination``,
        then drop them from the DLQ (a crash in between publishes them again: at least
        once, as every delivery)."""
        records = await self.backend.read_dlq(group, most)
        chunk: list[Message] = []
        size = 0
        largest = max((len(r.body) for r in records), default=0)
        if largest > destination.config.max_message_bytes:  # before any is published
            raise MessageTooLarge(
                f"a message of {largest} bytes is larger than {destination.name}'s "
                f"MaximumMessageSize ({destination.config.max_message_bytes})"
            )
        for r in records:
            if chunk and size + len(r.body) > PUBLISH_BYTES:
                await self.backend.publish(destination, chunk, None)
                chunk, size = [], 0
            chunk.append(Message(r.body, r.attributes, delay_ms=0, text=r.text, key=r.key,
                                 expires_ms=r.expires_ms))  # fmt: skip
            size += len(r.body)
        if chunk:
            await self.backend.publish(destination, chunk, None)
        return await self.backend.purge_dlq(group, len(records)) if records else 0
