"""A small disk for a test: a tmpfs of a given size mounted on a directory (needs root)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def small_disk(directory: Path, megabytes: int) -> Iterator[Path]:
    directory.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(directory)],
        check=True,
    )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)
