"""Redis peer: the reliable-list queue pattern (as in Celery/kombu-style Redis queues).

* one list per consumer group; publish = ``LPUSH`` of the whole batch to every group's list
  in one pipeline (fan-out = one copy per group), returning once Redis replied;
* consume: ``BLMOVE`` (blocking) one message from the group list (right end, the oldest) to
  a per-consumer processing list, then up to ``batch - 1`` more with non-blocking ``LMOVE``
  in one pipeline; ack = ``LREM`` from the processing list, nack = ``LREM`` + ``LPUSH`` back
  onto the group list; the acks and nacks of a batch go in one MULTI/EXEC pipeline.

Durability is whatever the server is configured for; this driver does not change it. The
durability string is built from ``CONFIG GET`` at ``available()`` time.
"""

from __future__ import annotations

from typing import Any

from redis import asyncio as aioredis

from ._common import Handler, pids_by_name, raise_if_cancelled, safe_name


class RedisDriver:
    name = "redis-list"

    def __init__(
        self, url: str = "redis://127.0.0.1:6379/0", batch: int = 100, block_timeout_s: int = 1
    ) -> None:
        self.url = url
        self.batch = batch
        self.block_timeout_s = block_timeout_s
        self.durability = "in-memory lists (server persistence settings not read yet)"
        self._client: aioredis.Redis | None = None
        self._prefix = ""
        self._lists: list[str] = []

    async def available(self) -> str | None:
        client = aioredis.Redis.from_url(self.url, socket_connect_timeout=3, socket_timeout=3)
        try:
            await client.ping()
            self.durability = await _describe_persistence(client)
        except Exception as exc:  # noqa: BLE001 - the reason is the answer
            return f"cannot reach {self.url}: {exc!r}"
        finally:
            await client.aclose()
        return None

    async def setup(self, run_id: str, groups: int) -> None:
        self._prefix = f"bench:{safe_name(run_id)}"
        self._lists = [f"{self._prefix}:g{g}" for g in range(groups)]
        self._client = aioredis.Redis.from_url(self.url, socket_connect_timeout=5)
        await self._delete_keys()

    async def publish(self, bodies: list[bytes]) -> None:
        assert self._client is not None, "setup() first"
        async with self._client.pipeline(transaction=False) as pipe:
            for key in self._lists:
                pipe.lpush(key, *bodies)
            await pipe.execute()

    async def consume(self, group: int, consumer: int, handler: Handler) -> None:
        assert self._client is not None, "setup() first"
        source = self._lists[group]
        processing = f"{source}:c{consumer}:processing"
        while True:
            raise_if_cancelled()
            bodies = await self._take(source, processing)
            if bodies:
                await self._settle(source, processing, [(b, handler(b)) for b in bodies])

    async def _take(self, source: str, processing: str) -> list[bytes]:
        client = self._client
        assert client is not None
        first = await client.blmove(source, processing, self.block_timeout_s, "RIGHT", "LEFT")
        if first is None:
            return []
        async with client.pipeline(transaction=False) as pipe:
            for _ in range(self.batch - 1):
                pipe.lmove(source, processing, "RIGHT", "LEFT")
            more = await pipe.execute()
        return [first, *(body for body in more if body is not None)]

    async def _settle(
        self, source: str, processing: str, decisions: list[tuple[bytes, bool]]
    ) -> None:
        client = self._client
        assert client is not None
        async with client.pipeline(transaction=True) as pipe:
            for body, ok in decisions:
                pipe.lrem(processing, 1, body)  # type: ignore[arg-type]  # bytes value is fine
                if not ok:
                    pipe.lpush(source, body)
            await pipe.execute()

    async def teardown(self) -> None:
        try:
            if self._client is not None:
                await self._delete_keys()
        finally:
            if self._client is not None:
                await self._client.aclose()
            self._client = None
            self._lists = []

    async def _delete_keys(self) -> None:
        assert self._client is not None
        keys = [key async for key in self._client.scan_iter(match=f"{self._prefix}:*", count=1000)]
        if keys:
            await self._client.delete(*keys)

    def server_pids(self) -> list[int]:
        return pids_by_name("redis-server")


async def _describe_persistence(client: aioredis.Redis) -> str:
    """Say honestly what an acknowledged LPUSH survives, from the live server config."""
    try:
        config: dict[Any, Any] = {}
        for name in ("save", "appendonly", "appendfsync"):
            config.update(await client.config_get(name))
    except Exception as exc:  # noqa: BLE001 - CONFIG may be disabled
        return f"in-memory lists; persistence settings unknown (CONFIG GET failed: {exc!r})"
    text = {_text(k): _text(v) for k, v in config.items()}
    save, aof = text.get("save", ""), text.get("appendonly", "no")
    fsync = text.get("appendfsync", "")
    if aof == "yes":
        disk = f"AOF on, appendfsync {fsync}" + (
            "" if fsync == "always" else ", no fsync before the reply"
        )
    else:
        disk = f'in memory only, NO fsync: appendonly no, save "{save}"' + (
            "" if save else " (no snapshots either)"
        )
    return f"{disk}; list + processing list, LREM acks"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def make_driver(**opts: Any) -> RedisDriver:
    return RedisDriver(**opts)
