"""Store hosts as child processes of a node, each with its own RocksDB directory.

A synced RocksDB write holds the GIL, so store hosts never share the node's event loop
(docs/design/architecture.md). A child that dies is started again on the same directory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable

from cherami.errors import Unavailable
from cherami.wire.handshake import SECRET_ENV

log = logging.getLogger("cherami.storehost.process")

READY_TIMEOUT = 30.0


class StoreProcess:
    """One supervised store-host child process."""

    def __init__(
        self,
        store_id: str,
        data_dir: str,
        host: str,
        on_address: Callable[[str, str], Awaitable[None]],
        secret: bytes,
    ) -> None:
        """``secret``: the node's cluster secret, which the child's clients must prove."""
        self.store_id = store_id
        self.data_dir = data_dir
        self.host = host
        self.address = ""
        self._on_address = on_address
        self._env = {**os.environ, SECRET_ENV: secret.decode()}
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise())

    async def _spawn(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cherami.roles.storehost",
            "--data-dir", self.data_dir, "--host", self.host, "--port", "0",
            "--parent", str(os.getpid()),
            stdout=asyncio.subprocess.PIPE, env=self._env,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT)
        except TimeoutError:
            proc.kill()
            raise Unavailable(f"store host {self.store_id} did not start") from None
        if not line.startswith(b"READY "):
            await proc.wait()
            raise Unavailable(
                f"store host {self.store_id} failed to start (exit {proc.returncode})"
            )
        self._proc = proc
        self.address = line.split()[1].decode()
        log.info("store host %s ready at %s (pid %d)", self.store_id, self.address, proc.pid)
        await self._on_address(self.store_id, self.address)

    async def _supervise(self) -> None:
        while not self._stopping:
            assert self._proc is not None
            code = await self._proc.wait()
            if self._stopping:
                return
            log.error("store host %s exited with %s; restarting", self.store_id, code)
            await asyncio.sleep(0.2)
            with contextlib.suppress(Unavailable):
                await self._spawn()

    def kill(self) -> None:
        """SIGKILL the child (fault tests); the supervisor starts it again."""
        if self._proc and self._proc.returncode is None:
            self._proc.kill()

    async def stop(self) -> None:
        self._stopping = True
        proc = self._proc
        if proc and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._supervisor:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
