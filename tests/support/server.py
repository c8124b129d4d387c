"""Start ``cherami serve`` as a real process on a free loopback port."""

from __future__ import annotations

import re
import uuid

from cherami.devcluster.nodeproc import NodeProcess as ServerProcess

__all__ = ["ServerProcess", "recovered", "unique"]

RECOVERED = re.compile(r"recovered (\d+) open extents: (\d+) kept open, (\d+) sealed")


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def recovered(server: ServerProcess) -> tuple[int, int, int]:
    """What the node's last recovery logged: open extents looked at, kept open, sealed."""
    matches = [m for line in server.output if (m := RECOVERED.search(line))]
    assert matches, "the node logged no recovery"
    total, kept, sealed = (int(g) for g in matches[-1].groups())
    return total, kept, sealed
