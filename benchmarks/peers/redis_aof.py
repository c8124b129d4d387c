"""Redis with its append-only file synced before every reply: the like-for-like row.

The machine's Redis keeps nothing on disk, so its row compares a memory-only list with
fsynced replicas. This driver starts a private ``redis-server`` on a free loopback port
with ``appendonly yes``, ``appendfsync always`` and no snapshots, in a temporary directory,
and runs the same reliable-list pattern as ``peers.redis`` against it. Redis writes the
commands of one event-loop pass to the AOF and fsyncs once before it sends the replies
(group commit), on one copy: no replicas.

The driver is left out (with the reason) when ``redis-server`` is not on the PATH.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from typing import Any

from redis import asyncio as aioredis

from .redis import RedisDriver


class RedisAofDriver(RedisDriver):
    name = "redis-aof"

    def __init__(self, batch: int = 100) -> None:
        super().__init__(url="", batch=batch)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            return  # available() says so
        self._tmp = tempfile.TemporaryDirectory(prefix="cherami-bench-redis-")
        port = _free_port()
        self.url = f"redis://127.0.0.1:{port}/0"
        self._proc = await asyncio.create_subprocess_exec(
            binary,
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", self._tmp.name),
            *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await _wait_ready(self.url, self._proc)

    async def available(self) -> str | None:
        if self._proc is None:
            return "redis-server is not on the PATH"
        return await super().available()

    async def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), timeout=10)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def server_pids(self) -> list[int]:
        return [self._proc.pid] if self._proc is not None else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if proc.returncode is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode} before it answered")
        client = aioredis.Redis.from_url(url, socket_connect_timeout=1)
        try:
            await client.ping()
            return
        except (OSError, aioredis.ConnectionError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
        finally:
            await client.aclose()


def make_driver(**opts: Any) -> RedisAofDriver:
    return RedisAofDriver(**opts)
