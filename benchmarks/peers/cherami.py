"""This project as a benchmark driver: a node on the embedded default (3 store hosts as
child processes, RocksDB with synced writes), started by the driver on a free port.

* ``mode="stream"``: the WebSocket streaming publisher (pipelined batch frames) and the
  credit-based streaming consumer (acks sent in batches);
* ``mode="http"``: the connectionless HTTP API: batch publish, receive with long poll,
  ack/nack by receipts.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.client.models import OutgoingMessage  # noqa: E402
from cherami.client.stream import Publisher  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess as ServerProcess  # noqa: E402

from ._common import Handler, raise_if_cancelled, safe_name  # noqa: E402


class CheramiDriver:
    supports_delay = True

    def __init__(self, mode: str = "stream", replicas: int = 3, credit: int = 2000) -> None:
        self.mode = mode
        self.replicas = replicas
        self.credit = credit
        self.name = f"cherami-{mode}"
        self.durability = (
            f"{replicas} replicas, each batch fsynced (RocksDB sync write) on every replica "
            "before the publish ack; an HTTP ack answered once persisted (group commit), stream "
            "acks persisted within 50 ms"
        )
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._server: ServerProcess | None = None
        self._client: AsyncClient | None = None
        self._publisher: Publisher | None = None
        self._queue = ""

    async def start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="cherami-bench-")
        self._server = ServerProcess(Path(self._tmp.name), stores=max(3, self.replicas)).start()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def available(self) -> str | None:
        return None if self._server is not None else "the node did not start"

    @property
    def url(self) -> str:
        assert self._server is not None
        return self._server.url

    async def setup(self, run_id: str, groups: int) -> None:
        self._queue = safe_name(run_id)
        self._client = AsyncClient(self.url, timeout=120)
        await self._client.create_queue(self._queue, replicas=self.replicas)
        for g in range(groups):
            await self._client.create_group(self._queue, f"g{g}", visibility_timeout_seconds=60)
        if self.mode == "stream":
            self._publisher = await self._client.publisher(
                self._queue, max_in_flight=64
            ).__aenter__()

    async def publish(self, bodies: list[bytes], delay_seconds: float | None = None) -> None:
        assert self._client is not None
        messages: list[OutgoingMessage] | list[bytes] = (
            [OutgoingMessage(b, None, delay_seconds) for b in bodies] if delay_seconds else bodies
        )
        if self._publisher is not None:
            await self._publisher.publish(messages)
        else:
            await self._client.publish(self._queue, messages)

    async def consume(self, group: int, consumer: int, handler: Handler) -> None:
        if self.mode == "stream":
            await self._consume_stream(f"g{group}", handler)
        else:
            await self._consume_http(f"g{group}", handler)

    async def _consume_stream(self, group: str, handler: Handler) -> None:
        async with (
            AsyncClient(self.url) as client,
            client.consumer(self._queue, group, credit=self.credit) as stream,
        ):
            while True:
                raise_if_cancelled()
                batch = await stream.get_batch(1000, timeout=1.0)
                nacked = []
                for m in batch:
                    if handler(m.body):
                        stream.ack(m)
                    else:
                        nacked.append(m)
                if nacked:
                    await stream.nack(*nacked)

    async def _consume_http(self, group: str, handler: Handler) -> None:
        async with AsyncClient(self.url) as client:
            while True:
                raise_if_cancelled()
                got = await client.receive(self._queue, group, max_messages=500, wait_seconds=1)
                acks, nacks = [], []
                for m in got:
                    (acks if handler(m.body) else nacks).append(m.receipt or "")
                if acks:
                    await client.ack(self._queue, group, acks)
                if nacks:
                    await client.nack(self._queue, group, nacks)

    async def teardown(self) -> None:
        if self._publisher is not None:
            await self._publisher.close()
            self._publisher = None
        if self._client is not None:
            await self._client.delete_queue(self._queue)
            await self._client.close()
            self._client = None

    def server_pids(self) -> list[int]:
        if self._server is None or self._server.proc is None:
            return []
        root = psutil.Process(self._server.proc.pid)
        return [root.pid, *(p.pid for p in root.children(recursive=True))]


def make_driver(**opts: Any) -> CheramiDriver:
    return CheramiDriver(**opts)
