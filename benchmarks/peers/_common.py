"""Small helpers shared by the peer drivers (kept free of harness imports)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

Handler = Callable[[bytes], bool]


def pids_by_name(*names: str) -> list[int]:
    """Pids whose /proc/<pid>/comm is one of ``names`` (Linux only)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="ascii", errors="replace") as fh:
                if fh.read().strip() in names:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def safe_name(run_id: str) -> str:
    """Letters, digits, '-' and '_' only: valid as a queue, stream or key name everywhere."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in run_id)


def raise_if_cancelled() -> None:
    """Re-raise a cancellation that a client library swallowed.

    redis-py (and occasionally other clients) can catch the CancelledError delivered
    into a blocking read and carry on; a consumer loop calls this once per iteration so
    that the harness can still stop it.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
