"""Start ``cherami serve`` as a real process on a free loopback port."""

from __future__ import annotations

import uuid

from cherami.cluster.nodeproc import NodeProcess as ServerProcess

__all__ = ["ServerProcess", "unique"]


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
