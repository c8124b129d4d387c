"""Small helpers shared by the peer drivers (kept free of harness imports)."""

from __future__ import annotations

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
