"""Start ``cherami serve`` as a real process on a free loopback port."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from cherami.devcluster.nodeproc import NodeProcess as ServerProcess

__all__ = ["ServerProcess", "keyed_node", "recovered", "unique"]

RECOVERED = re.compile(r"recovered (\d+) open extents: (\d+) kept open, (\d+) sealed")


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def keyed_node(
    root: Path, keys: list[dict[str, Any]], stores: int = 3, extra: tuple[str, ...] = ()
) -> ServerProcess:
    """A node started with API keys: ``keys`` are the auth file's entries (docs/api.md,
    "Auth"), written to ``root/keys.json``; the node's data in ``root/node``."""
    auth = root / "keys.json"
    auth.write_text(json.dumps(keys))
    return ServerProcess(root / "node", stores, ["--auth-file", str(auth), *extra]).start()


def recovered(server: ServerProcess) -> tuple[int, int, int]:
    """What the node's last recovery logged: open extents looked at, kept open, sealed."""
    matches = [m for line in server.output if (m := RECOVERED.search(line))]
    assert matches, "the node logged no recovery"
    total, kept, sealed = (int(g) for g in matches[-1].groups())
    return total, kept, sealed
