"""One server per data dir, and an unknown log level: one-line errors, before anything
starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cherami.config import NodeConfig
from cherami.datadir import LOCK_NAME, lock_data_dir
from cherami.errors import InvalidRequest


def test_a_second_lock_on_a_data_dir_names_the_holder(tmp_path: Path) -> None:
    held = lock_data_dir(str(tmp_path / "data"))
    try:
        with pytest.raises(
            InvalidRequest, match=f"in use by another cherami serve \\(pid {os.getpid()}\\)"
        ):
            lock_data_dir(str(tmp_path / "data"))
    finally:
        held.close()
    again = lock_data_dir(str(tmp_path / "data"))  # free once the holder is gone
    assert (tmp_path / "data" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    again.close()


def test_unknown_log_level_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="--log-level 'LOUD': must be one of DEBUG"):
        NodeConfig(log_level="LOUD").log_level_name()
    assert NodeConfig(log_level="debug").log_level_name() == "DEBUG"
    result = subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", "serve", "--data-dir", str(tmp_path),
         "--port", "0", "--log-level", "LOUD"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2  # a usage error (ConfigError)
    assert result.stderr.strip().splitlines() == [
        "error: invalid_config: --log-level 'LOUD': must be one of DEBUG, INFO, WARNING, "
        "ERROR, CRITICAL"
    ]
