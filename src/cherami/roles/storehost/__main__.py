"""Run one store host process: ``python -m cherami.roles.storehost --data-dir DIR``.

Prints ``READY <host:port>`` on stdout once it serves. When started by a node it dies
with its parent (Linux PR_SET_PDEATHSIG), so a killed node leaves no store host behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import os
import signal
import sys

import uvloop

from cherami.roles.storehost.server import StoreHostService
from cherami.storage.base import StorageError
from cherami.storage.rocks import RocksExtentStore

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


async def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


async def _main(args: argparse.Namespace) -> None:
    store = RocksExtentStore(args.data_dir)
    service = StoreHostService(store, args.host, args.port, data_dir=args.data_dir)
    await service.start()
    print(f"READY {service.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # a node's store host is stopped by the node (SIGTERM), after the roles that use it:
    # a Ctrl-C reaches the whole foreground process group, and store hosts that stopped
    # first left the node's readers logging dozens of "connection lost" on the way out
    loop.add_signal_handler(signal.SIGINT, (lambda: None) if args.parent else stop.set)
    watcher = asyncio.create_task(_watch_parent(args.parent)) if args.parent else None
    await stop.wait()
    if watcher:
        watcher.cancel()
    await service.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cherami-storehost")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0, help="exit when this process is gone")
    args = parser.parse_args(argv)
    if args.parent:
        _die_with_parent()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        uvloop.run(_main(args))
    except KeyboardInterrupt:
        sys.exit(0)
    except StorageError as err:  # e.g. a data directory of an older format
        print(f"cherami-storehost: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
