"""A node in this test process, its store hosts in-process over memory
(roles/storehost/inprocess.py): for the tests of the roles' logic, where store host
processes, RocksDB and fsyncs add nothing but time. It runs on an event loop of its own
in a thread, so a test reaches it over HTTP as it reaches a node process (``url``),
from sync and async code alike. It cannot be killed or restarted on its data: the
durability and fault tests use real processes (tests/support/server.py)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from cherami.config import NodeConfig
from cherami.server.node import Node

START_TIMEOUT = 60.0


class InProcessNode:
    def __init__(self, data_dir: Path, stores: int = 3, **config: Any) -> None:
        """``config``: NodeConfig fields besides the data dir, port and stores."""
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.config = NodeConfig(data_dir=str(data_dir), port=0, stores=stores, **config)
        self.node: Node | None = None
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> InProcessNode:
        self._thread.start()
        self.node = Node(self.config, in_process_stores=True)
        self._call(self.node.start()).result(START_TIMEOUT)
        self.url = f"http://{self.config.host}:{self.node.port}"
        return self

    def _call(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stop(self) -> int:
        """Stop it; 0, as a node process that stopped cleanly exits with."""
        if self.node is not None:
            self._call(self.node.stop()).result(START_TIMEOUT)
            self.node = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT)
            self._loop.close()
        return 0
