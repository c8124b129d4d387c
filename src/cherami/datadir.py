"""One server per data directory: ``cherami serve`` holds an exclusive lock on
``DIR/cherami.lock`` while it runs, so a second one on the same directory stops at once
with one line that names the directory and the process holding it."""

from __future__ import annotations

import fcntl
import os
from typing import IO

from cherami.errors import InvalidRequest

LOCK_NAME = "cherami.lock"


def lock_data_dir(path: str) -> IO[str]:
    """Lock ``path`` for this process; keep the returned file open while it runs (the
    lock goes with the process, even on kill -9)."""
    os.makedirs(path, exist_ok=True)
    lock = open(os.path.join(path, LOCK_NAME), "a+")  # noqa: SIM115 (held while running)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise InvalidRequest(
            f"data dir {path} is in use by another cherami serve (pid {holder})"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock
