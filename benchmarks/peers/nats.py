"""NATS JetStream peer: file-storage stream, durable pull consumers, explicit acks (nats-py).

* one group: a work-queue retention stream with one durable pull consumer shared by the
  group's consumers; several groups: an interest retention stream with one durable pull
  consumer per group (a message is kept until every group acked it);
* publish: ``js.publish_async`` for every body of the batch, then ``gather`` of the
  returned ack futures, so the call returns once the stream stored all of them;
* consume: each consumer has its own connection, binds to its group's durable consumer and
  fetches in batches; every message is acked (``+ACK``) or nacked (``-NAK``, redelivered)
  explicitly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from ._common import Handler, pids_by_name, raise_if_cancelled, safe_name

DURABILITY = (
    "file stream, 1 replica, acked once in the OS page cache: no fsync before "
    "the ack (fsync every 2 min, NATS default), explicit acks"
)


class NatsDriver:
    name = "nats-jetstream"
    durability = DURABILITY

    def __init__(
        self,
        url: str = "nats://127.0.0.1:4222",
        fetch_batch: int = 256,
        max_ack_pending: int = 20_000,
        ack_wait_s: float = 30.0,
    ) -> None:
        self.url = url
        self.fetch_batch = fetch_batch
        self.max_ack_pending = max_ack_pending
        self.ack_wait_s = ack_wait_s
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._stream = ""
        self._subject = ""

    async def available(self) -> str | None:
        try:
            nc = await nats.connect(
                self.url, connect_timeout=3, max_reconnect_attempts=0, allow_reconnect=False
            )
        except Exception as exc:  # noqa: BLE001 - the reason is the answer
            return f"cannot connect to {self.url}: {exc!r}"
        try:
            await nc.jetstream().account_info()
        except Exception as exc:  # noqa: BLE001
            return f"JetStream not enabled at {self.url}: {exc!r}"
        finally:
            await nc.close()
        return None

    async def setup(self, run_id: str, groups: int) -> None:
        name = safe_name(run_id)
        self._stream, self._subject = f"BENCH_{name}", f"bench.{name}"
        self._nc = await nats.connect(self.url, connect_timeout=5)
        self._js = self._nc.jetstream(timeout=10)
        retention = RetentionPolicy.WORK_QUEUE if groups == 1 else RetentionPolicy.INTEREST
        await self._js.add_stream(
            StreamConfig(
                name=self._stream,
                subjects=[self._subject],
                storage=StorageType.FILE,
                retention=retention,
                num_replicas=1,
            )
        )
        for group in range(groups):
            await self._js.add_consumer(
                self._stream,
                ConsumerConfig(
                    durable_name=f"g{group}",
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    max_ack_pending=self.max_ack_pending,
                    ack_wait=self.ack_wait_s,
                ),
            )

    async def publish(self, bodies: list[bytes]) -> None:
        assert self._js is not None, "setup() first"
        js, subject = self._js, self._subject
        futures = [await js.publish_async(subject, body) for body in bodies]
        await asyncio.gather(*futures)

    async def consume(self, group: int, consumer: int, handler: Handler) -> None:
        nc = await nats.connect(self.url, connect_timeout=5)
        try:
            sub = await nc.jetstream().pull_subscribe_bind(durable=f"g{group}", stream=self._stream)
            while True:
                raise_if_cancelled()
                try:
                    msgs = await sub.fetch(self.fetch_batch, timeout=1.0)
                except TimeoutError:  # nats.errors.TimeoutError included: no messages yet
                    continue
                for msg in msgs:
                    if handler(msg.data):
                        await msg.ack()
                    else:
                        await msg.nak()
        finally:
            await asyncio.shield(_close(nc))

    async def teardown(self) -> None:
        try:
            if self._js is not None and self._stream:
                await self._js.delete_stream(self._stream)
        finally:
            if self._nc is not None:
                await _close(self._nc)
            self._nc = self._js = None
            self._stream = self._subject = ""

    def server_pids(self) -> list[int]:
        return pids_by_name("nats-server")


async def _close(nc: Client) -> None:
    try:
        await asyncio.wait_for(nc.close(), 5)
    except Exception:  # noqa: BLE001 - closing a broken connection is best effort
        pass


def make_driver(**opts: Any) -> NatsDriver:
    return NatsDriver(**opts)
