"""Schemathesis over /openapi.json against a real node (issue 14): bounded generated
requests to every operation, and not one server error (5xx) in the answers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.server import ServerProcess


def test_no_generated_request_gets_a_server_error(tmp_path: Path) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert cli is not None, "schemathesis is not installed (make install: the dev extra)"
    server = ServerProcess(tmp_path / "node").start()
    try:
        done = subprocess.run(
            [cli, "run", f"{server.url}/openapi.json", "--checks", "not_a_server_error",
             "--max-examples", "10", "--seed", "1", "--no-color"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        server.stop()
    summary = done.stdout[-3000:]
    print(summary)
    assert done.returncode == 0, summary
    assert " passed" in summary and "generated" in summary, summary
