"""The SQS endpoint's state in the metadata store (a real SQLite one): message move
tasks run, cancelled, resumed after a restart and taken over by another frontend;
an older version's ``sqs.json`` moved in once. The DLQ merges are counted by a
stand-in backend (the merge itself is the controller's, tested with the cluster in
tests/integration/test_sqs_cluster.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from cherami.errors import Unavailable
from cherami.metadata.models import Group, GroupConfig, Queue, QueueConfig
from cherami.metadata.remembered import RememberingReads
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.roles.frontend.sqs import movetasks as mt
from cherami.roles.frontend.sqs.settings import FILE, QueueSettings, SettingsStore
from cherami.wire.records import Message, Record

ARN = "arn:aws:sqs:us-east-1:000000000000:dlq"


class Dlqs:
    """What MoveTasks asks of the backend: the sources' dead-lettered counts, merges."""

    def __init__(self, metadata: SqliteMetadataStore, dead: dict[str, int]) -> None:
        self.r = SimpleNamespace(metadata=metadata)
        self.dead = dead
        self.passed = dict.fromkeys(dead, 100)  # the DLQ cursor: merged or purged before
        self.merges: list[int] = []
        self.fail_after_merge = 0  # the next merges fail once they are done (a crash)
        self.published: list[tuple[str, str]] = []

    async def find(self, name: str) -> tuple[Queue, Group] | None:
        if name not in self.dead:
            return None
        group = Group(queue=name, name="sqs", config=GroupConfig(), created_at=0.0,
                      start_ms=0, dlq=f"{name}.dlq")  # fmt: skip
        return Queue(name=name, config=QueueConfig(), created_at=0.0), group

    async def read_dlq(self, group: Group, most: int) -> list[Record]:
        first = self.passed[group.queue]
        count = min(most, self.dead[group.queue])
        return [Record(0, 0, f"m{first + i}".encode()) for i in range(count)]

    async def publish(self, queue: Queue, messages: list[Message], key: Any) -> list[str]:
        self.published += [(queue.name, m.body.decode()) for m in messages]
        return [""] * len(messages)

    async def purge_dlq(self, group: Group, most: int | None = None) -> int:
        return await self.merge_dlq(group, most)

    async def dlq_position(self, group: Group) -> tuple[int, int]:
        return self.dead[group.queue], self.passed[group.queue]

    async def merge_dlq(self, group: Group, most: int | None = None) -> int:
        n = self.dead[group.queue] if most is None else min(most, self.dead[group.queue])
        self.dead[group.queue] -= n
        self.passed[group.queue] += n
        self.merges.append(n)
        if self.fail_after_merge:
            self.fail_after_merge -= 1
            raise Unavailable("the answer was lost")
        return n


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.db"))
    for name in ("dlq", "src"):
        await store.insert_queue(Queue(name=name, config=QueueConfig(), created_at=1.0))
    yield store
    await store.close()


def tasks_of(dlqs: Dlqs, holder: str, step: float = 0.01, lease: float = 0.3) -> mt.MoveTasks:
    return mt.MoveTasks(cast(Any, dlqs), holder, step_seconds=step, lease_seconds=lease)


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := await check():
            return got
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout} s: {what}")


async def newest(tasks: mt.MoveTasks) -> dict[str, Any]:
    found, props = await tasks.tasks("dlq")
    return mt.as_sqs("dlq", found[0], found[0].key == props.get(mt.CANCEL))


async def status(tasks: mt.MoveTasks, wanted: str) -> dict[str, Any] | None:
    task = await newest(tasks)
    return task if task["Status"] == wanted else None


async def test_a_rated_task_moves_its_rate_a_step_until_done(meta: SqliteMetadataStore) -> None:
    dlqs = Dlqs(meta, {"src": 5})
    tasks = tasks_of(dlqs, "a")
    sources = [(await dlqs.find("src"))[1]]  # type: ignore[index]
    handle = await tasks.start("dlq", sources, ARN, None, 2)
    assert mt.parse_handle(handle) == ("dlq", (await tasks.tasks("dlq"))[0][0].key)
    done = await until(lambda: status(tasks, "COMPLETED"), "the task done")
    assert (done["ApproximateNumberOfMessagesMoved"], done["ApproximateNumberOfMessagesToMove"],
            done["MaxNumberOfMessagesPerSecond"]) == (5, 5, 2)  # fmt: skip
    assert dlqs.merges == [2, 2, 1] and "TaskHandle" not in done
    assert await meta.get_queue_properties("dlq", mt.MOVING) == {}
    assert await meta.try_lease("sqs-move:dlq", "b", 10.0) is not None  # released when done
    await until(lambda: asyncio.sleep(0, not tasks._runners), "the runner forgotten")
    await tasks.start("dlq", sources, ARN, None, None)  # unrated, nothing left: done at once
    assert (await newest(tasks))["Status"] == "COMPLETED"
    await tasks.close()


async def test_a_step_cut_short_after_its_merge_is_counted_once(
    meta: SqliteMetadataStore,
) -> None:
    """Progress is read from the DLQ cursor: a merge whose step never wrote its count
    (its answer lost, or the process killed there) is counted, and not moved again."""
    dlqs = Dlqs(meta, {"src": 5})
    dlqs.fail_after_merge = 2
    tasks = tasks_of(dlqs, "a")
    await tasks.start("dlq", [(await dlqs.find("src"))[1]], ARN, None, 2)  # type: ignore[index]
    done = await until(lambda: status(tasks, "COMPLETED"), "the task done")
    assert done["ApproximateNumberOfMessagesMoved"] == 5 and sum(dlqs.merges) == 5
    await tasks.close()


async def test_a_move_elsewhere_copies_then_drops_in_steps(meta: SqliteMetadataStore) -> None:
    dlqs = Dlqs(meta, {"src": 5, "dest": 0})
    tasks = tasks_of(dlqs, "a")
    src = (await dlqs.find("src"))[1]  # type: ignore[index]
    await tasks.start("dlq", [src], ARN, ARN + "-dest", 2, "dest")
    done = await until(lambda: status(tasks, "COMPLETED"), "the copy done")
    assert done["ApproximateNumberOfMessagesMoved"] == 5 and dlqs.merges == [2, 2, 1]
    assert dlqs.published == [("dest", f"m{100 + i}") for i in range(5)]  # oldest first
    dlqs.dead["src"] = 3
    small = QueueConfig(max_message_bytes=3)  # smaller than "m105": refused, none copied
    dlqs.find = lambda name: asyncio.sleep(  # type: ignore[method-assign]
        0, (Queue(name=name, config=small, created_at=0.0), src)
    )
    await tasks.start("dlq", [src], ARN, ARN + "-dest", None, "dest")
    failed = await until(lambda: status(tasks, "FAILED"), "the copy refused")
    assert failed["FailureReason"].startswith("message_too_large: a message of 4 bytes")
    assert len(dlqs.published) == 5 and dlqs.dead["src"] == 3
    del dlqs.find
    del dlqs.dead["dest"]  # deleted since
    await tasks.start("dlq", [src], ARN, ARN + "-dest", None, "dest")
    failed = await until(lambda: status(tasks, "FAILED"), "the copy failed")
    assert failed["FailureReason"] == "AWS.SimpleQueueService.NonExistentQueue"
    await tasks.close()


async def test_of_two_starts_at_once_one_is_refused(meta: SqliteMetadataStore) -> None:
    dlqs = Dlqs(meta, {"src": 5})
    here, there = tasks_of(dlqs, "a", step=60.0), tasks_of(dlqs, "b", step=60.0)
    src = (await dlqs.find("src"))[1]  # type: ignore[index]
    handles = await asyncio.gather(
        here.start("dlq", [src], ARN, None, 1), here.start("dlq", [src], ARN, None, 1),
        there.start("dlq", [src], ARN, None, 1),
    )  # fmt: skip
    assert sum(h is not None for h in handles) == 1
    assert len((await here.tasks("dlq"))[0]) == 1
    await here.close()
    await there.close()


async def test_cancel_stops_it_at_its_next_step(meta: SqliteMetadataStore) -> None:
    dlqs = Dlqs(meta, {"src": 5})
    tasks = tasks_of(dlqs, "a", step=60.0)  # one step, then a long pause a cancel cuts
    handle = await tasks.start("dlq", [(await dlqs.find("src"))[1]], ARN, None, 1)  # type: ignore[index]
    await until(lambda: asyncio.sleep(0, dlqs.merges == [1]), "the first step")
    dlq, key = mt.parse_handle(handle) or ("", "")
    assert (await tasks.cancel(dlq, key)) is not None
    cancelled = await until(lambda: status(tasks, "CANCELLED"), "the task cancelled")
    assert cancelled["ApproximateNumberOfMessagesMoved"] == 1 and dlqs.merges == [1]
    assert await tasks.cancel(dlq, key) is None  # not running any more
    await tasks.close()


async def test_a_restarted_frontend_resumes_and_another_takes_over(
    meta: SqliteMetadataStore,
) -> None:
    dlqs = Dlqs(meta, {"src": 6})
    first = tasks_of(dlqs, "a", step=60.0)
    await first.start("dlq", [(await dlqs.find("src"))[1]], ARN, None, 2)  # type: ignore[index]
    await until(lambda: asyncio.sleep(0, dlqs.merges == [2]), "the first step")
    await first.close()  # the process stops between steps
    again = tasks_of(dlqs, "a", step=60.0)  # the same host id: its lease is still its own
    await again.resume()
    await until(lambda: asyncio.sleep(0, dlqs.merges == [2, 2]), "resumed at once")
    await again.close()  # and stops for good: its lease runs out
    other = tasks_of(dlqs, "b")
    await other.resume()
    done = await until(lambda: status(other, "COMPLETED"), "taken over")
    assert done["ApproximateNumberOfMessagesMoved"] == 6 and dlqs.merges == [2, 2, 2]
    await other.close()


async def test_a_task_whose_sources_are_gone_fails(meta: SqliteMetadataStore) -> None:
    dlqs = Dlqs(meta, {"src": 3})
    tasks = tasks_of(dlqs, "a")
    group = (await dlqs.find("src"))[1]  # type: ignore[index]
    del dlqs.dead["src"]
    dlqs.dead["other"] = 0
    tasks.backend.dlq_position = lambda g: asyncio.sleep(0, (3, 0))  # type: ignore[method-assign]
    await tasks.start("dlq", [group], ARN, None, 1)
    failed = await until(lambda: status(tasks, "FAILED"), "the task failed")
    assert failed["FailureReason"] == "AWS.SimpleQueueService.NonExistentQueue"
    await tasks.close()


async def test_the_last_ten_tasks_are_kept(meta: SqliteMetadataStore) -> None:
    dlqs = Dlqs(meta, {"src": 0})
    tasks = tasks_of(dlqs, "a")
    group = (await dlqs.find("src"))[1]  # type: ignore[index]
    for _ in range(12):
        await tasks.start("dlq", [group], ARN, None, None)
    assert len((await tasks.tasks("dlq"))[0]) == mt.KEEP
    await meta.delete_queue("dlq")  # its tasks with it
    assert await meta.get_queue_properties("dlq") == {}
    assert mt.parse_handle("not-a-handle") is None and mt.parse_handle(None) is None


async def test_an_older_sqs_json_is_moved_in_once(
    meta: SqliteMetadataStore, tmp_path: Path
) -> None:
    settings = SettingsStore(meta)
    old = {
        "src": QueueSettings(
            wait_seconds=7,
            dead_letter_target="dlq",
            tags={"t": "1"},
            kept={"Policy": "{}"},
            modified=5.0,
        ),  # fmt: skip
        "gone": QueueSettings(wait_seconds=3),  # deleted since: dropped
        "dlq": QueueSettings(tags={"old": "x"}),  # set since in the store: kept as it is
    }
    (tmp_path / FILE).write_bytes(msgspec.json.encode(old))
    before = await settings.get("dlq")
    after = QueueSettings(tags={"new": "y"})
    await settings.put("dlq", before, after)
    assert await settings.migrate(str(tmp_path)) == 1
    assert await settings.get("src") == old["src"]
    assert (await settings.get("dlq")).tags == {"new": "y"}
    assert await settings.sources_of("dlq") == ["src"]
    assert not (tmp_path / FILE).exists() and (tmp_path / f"{FILE}.migrated").exists()
    assert await settings.migrate(str(tmp_path)) == 0 and await settings.migrate(None) == 0


class Outage:
    """A store whose reads of queue properties fail while ``down``."""

    def __init__(self, store: SqliteMetadataStore) -> None:
        self.store = store
        self.down = False

    def __getattr__(self, name: str) -> Any:  # writes: the store's own
        return getattr(self.store, name)

    async def get_queue_properties(self, queue: str, prefix: str = "") -> dict[str, str]:
        if self.down:
            raise Unavailable("metadata store unavailable")
        return await self.store.get_queue_properties(queue, prefix)


async def test_a_receives_default_wait_is_read_through_a_metadata_outage(
    meta: SqliteMetadataStore,
) -> None:
    """A cluster process reads the settings through RememberingReads: a receive
    without its own wait still finds the queue's default while the store is out."""
    outage = Outage(meta)
    settings = SettingsStore(RememberingReads(cast(Any, outage)))
    await settings.put("src", QueueSettings(), QueueSettings(wait_seconds=9))
    assert (await settings.get("src")).wait_seconds == 9
    outage.down = True
    assert (await settings.get("src")).wait_seconds == 9
