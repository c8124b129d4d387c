"""``cherami serve``: run a node until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import logging
import signal
import sys

import uvloop

from cherami.config import NodeConfig
from cherami.server.node import Node
from cherami.server.roleprocess import RoleProcess


async def _serve(config: NodeConfig) -> None:
    node: Node | RoleProcess = RoleProcess(config) if config.role else Node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    # SIGHUP: read --auth-file again (keys and their limits); a bad file keeps the old
    loop.add_signal_handler(signal.SIGHUP, node.keys.reload)
    try:
        if isinstance(node, RoleProcess):
            # a role waits for its metadata at start (RoleProcess._open_metadata): a
            # signal meanwhile stops it there
            starting = asyncio.ensure_future(node.start())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                return
            address = starting.result()
            scheme = "https" if config.tls_cert else "http"
            print(f"cherami {config.role} {node.id} listening on {scheme}://{address}", flush=True)
            if node.metrics_address:
                print(f"cherami {node.id} metrics at {scheme}://{node.metrics_address}/metrics",
                      flush=True)  # fmt: skip
            if node.sqs_address:
                print(f"cherami {node.id} SQS endpoint at {scheme}://{node.sqs_address}",
                      flush=True)  # fmt: skip
        else:
            await node.start()
            scheme = "https" if config.tls_cert else "http"
            print(f"cherami listening on {scheme}://{config.host}:{node.port}", flush=True)
            if config.sqs_port is not None:
                sqs = f"{scheme}://{config.host}:{node.sqs_port}"
                print(f"cherami SQS endpoint at {sqs}", flush=True)
        await stop.wait()
    finally:
        await node.stop()
        logging.getLogger("cherami.node").info("stopped")


def _dump_tasks() -> None:
    """SIGUSR1: print where every asyncio task waits (for an operator chasing a hang)."""
    for task in asyncio.all_tasks():
        buf = io.StringIO()
        task.print_stack(limit=8, file=buf)
        print(buf.getvalue(), file=sys.stderr, flush=True)


def _tune_gc() -> None:
    """Fewer, cheaper collections: the objects made at start-up are never freed, and the
    hot path makes many short-lived objects that reference counting frees anyway."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the fields a call passed
    in ``extra`` (queue, group, extent, seq, ...), and the traceback if any."""

    _plain = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._plain and key not in entry:
                entry[key] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def run_node(config: NodeConfig) -> None:
    level = config.log_level_name()
    if config.log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonLogFormatter())
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _tune_gc()
    uvloop.run(_serve(config))
