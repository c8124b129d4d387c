"""RabbitMQ peer: quorum queues, publisher confirms, manual acks (aio-pika / aiormq).

* one quorum queue per consumer group; with several groups they are bound to a fanout
  exchange, so every group gets every message;
* publish: one persistent message per body on a confirm-mode channel, the whole batch
  awaited together (``gather``), so the call returns once the broker confirmed all
  (sent with ``basic_publish`` of the aiormq channel under aio-pika, skipping aio-pika's
  Message wrapper: about 20-30% less client CPU per message);
* consume: each consumer has its own connection and channel with a prefetch window.
  Deliveries go to aio-pika's underlying aiormq channel callback (saves aio-pika's extra
  task and message object per delivery); acks are sent in order by one flusher per
  consumer, runs of acks as a single ``basic.ack(multiple=True)``, nacks one by one
  with ``requeue=True``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from pamqp.commands import Basic

from ._common import Handler, pids_by_name, safe_name

DURABILITY = (
    "quorum queue, 1 node, WAL fsync per batch before the confirm (RabbitMQ "
    "default), publisher confirms, manual acks"
)


class _Acker:
    """Queues ack/nack decisions and sends them in delivery order from one task."""

    def __init__(self, channel: Any, every: int, interval_s: float = 0.02) -> None:
        self._channel = channel  # aiormq channel
        self._every = every
        self._interval = interval_s
        self._pending: list[tuple[int, bool]] = []
        self._wake = asyncio.Event()

    def add(self, tag: int, ok: bool) -> None:
        self._pending.append((tag, ok))
        if len(self._pending) >= self._every or not ok:
            self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        last_ack: int | None = None
        for tag, ok in pending:
            if ok:
                last_ack = tag
                continue
            if last_ack is not None:
                await self._channel.basic_ack(last_ack, multiple=True)
                last_ack = None
            await self._channel.basic_nack(tag, multiple=False, requeue=True)
        if last_ack is not None:
            await self._channel.basic_ack(last_ack, multiple=True)


class RabbitMQDriver:
    name = "rabbitmq-quorum"
    durability = DURABILITY

    def __init__(
        self,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        prefetch: int = 1000,
        ack_every: int = 100,
    ) -> None:
        self.url = url
        self.prefetch = prefetch
        self.ack_every = ack_every
        self._conn: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._raw: Any = None  # the aiormq channel under self._channel
        self._routing_key = ""
        self._queues: list[str] = []
        self._exchange_name = ""

    async def available(self) -> str | None:
        try:
            conn = await aio_pika.connect(self.url, timeout=3)
        except Exception as exc:  # noqa: BLE001 - the reason is the answer
            return f"cannot connect to {self.url}: {exc!r}"
        await conn.close()
        return None

    async def setup(self, run_id: str, groups: int) -> None:
        base = f"bench.{safe_name(run_id)}"
        self._conn = await aio_pika.connect(self.url, timeout=10)
        self._channel = await self._conn.channel(publisher_confirms=True)
        self._queues = [f"{base}.g{g}" for g in range(groups)]
        declared = [
            await self._channel.declare_queue(
                queue, durable=True, arguments={"x-queue-type": "quorum"}
            )
            for queue in self._queues
        ]
        self._raw = await self._channel.get_underlay_channel()
        if groups == 1:  # default exchange, routed by queue name
            self._exchange_name, self._routing_key = "", self._queues[0]
            return
        exchange = await self._channel.declare_exchange(
            base, aio_pika.ExchangeType.FANOUT, durable=True
        )
        for queue in declared:
            await queue.bind(exchange)
        self._exchange_name, self._routing_key = base, ""

    async def publish(self, bodies: list[bytes]) -> None:
        assert self._raw is not None, "setup() first"
        publish, exchange, key = self._raw.basic_publish, self._exchange_name, self._routing_key
        results = await asyncio.gather(
            *(
                publish(
                    body,
                    exchange=exchange,
                    routing_key=key,
                    properties=Basic.Properties(delivery_mode=2),
                )  # persistent
                for body in bodies
            )
        )
        for confirm in results:
            if not isinstance(confirm, Basic.Ack):
                raise RuntimeError(f"broker did not confirm a message: {confirm!r}")

    async def consume(self, group: int, consumer: int, handler: Handler) -> None:
        conn = await aio_pika.connect(self.url, timeout=10)
        acker: _Acker | None = None
        try:
            channel = await conn.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=self.prefetch)
            raw = await channel.get_underlay_channel()
            acker = _Acker(raw, self.ack_every)

            async def on_message(message: Any) -> None:
                acker.add(message.delivery.delivery_tag, handler(message.body))

            await raw.basic_consume(self._queues[group], on_message, no_ack=False)
            await acker.run()
        finally:
            if acker is not None:  # settle what was handled, so the broker does not redeliver it
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(acker.flush(), 2)
            await _close(conn)

    async def teardown(self) -> None:
        try:
            if self._channel is not None and not self._channel.is_closed:
                for queue in self._queues:
                    await self._channel.queue_delete(queue)
                if self._exchange_name:
                    await self._channel.exchange_delete(self._exchange_name)
        finally:
            if self._conn is not None:
                await _close(self._conn)
            self._conn = self._channel = self._raw = None
            self._queues, self._exchange_name = [], ""

    def server_pids(self) -> list[int]:
        return pids_by_name("beam.smp")


async def _close(conn: AbstractConnection) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5)
    except Exception:  # noqa: BLE001 - closing a broken connection is best effort
        pass


def make_driver(**opts: Any) -> RabbitMQDriver:
    return RabbitMQDriver(**opts)
