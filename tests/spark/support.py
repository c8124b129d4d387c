"""Helpers of the Spark tests: set up queues and publish without an event loop of the test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from cherami.spark.control import ControlClient

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def run(url: str, work: Callable[[AsyncClient], Any]) -> Any:
    async def main() -> Any:
        async with AsyncClient(url) as client:
            return await work(client)

    return asyncio.run(main())


def setup_queue(url: str, queue: str, groups: dict[str, str], **config: Any) -> None:
    """Create ``queue`` and its groups (name to type: "stream" or "competing")."""

    async def work(client: AsyncClient) -> None:
        await client.create_queue(queue, **config)
        for name, kind in groups.items():
            await client.create_group(queue, name, type=kind)

    run(url, work)


def publish(url: str, queue: str, messages: Iterable[OutgoingMessage | str | bytes]) -> list[str]:
    items = list(messages)

    async def work(client: AsyncClient) -> list[str]:
        return await client.publish(queue, items)

    return run(url, work)  # type: ignore[no-any-return]


def eventually(check: Callable[[], Any], timeout: float = 30.0, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns a truthy value; fail with its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s (last: {value!r})")
        time.sleep(every)
        value = check()
    return value


def group_offsets(url: str, queue: str, group: str) -> dict[str, int]:
    return ControlClient(url).offsets(queue, group)[0]


def queue_ends(url: str, queue: str) -> dict[str, int]:
    """Where each plain extent with messages ends (next_seq after its last message)."""
    return {
        e.id: e.last_seq + 1 for e in ControlClient(url).extents(queue) if e.plain and e.last_seq
    }


def stream(spark: SparkSession, url: str, queue: str, group: str, **options: Any) -> DataFrame:
    """A streaming read of ``queue`` for the stream-mode ``group``."""
    reader = spark.readStream.format("cherami").option("url", url).option("queue", queue)
    reader = reader.option("group", group)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()
