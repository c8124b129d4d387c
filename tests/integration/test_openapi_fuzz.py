"""Schemathesis over /openapi.json against a real node (issues 14 and 16): bounded
generated requests to every operation with every check (tests/schemathesis.toml says
which refusals a schema-valid request may get), so: no server error, every status and
body as documented, schema-valid requests accepted, 405 answers with Allow."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.server import ServerProcess

CONFIG = Path(__file__).resolve().parent.parent / "schemathesis.toml"


def test_no_generated_request_gets_a_server_error(tmp_path: Path) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert cli is not None, "schemathesis is not installed (make install: the dev extra)"
    server = ServerProcess(tmp_path / "node").start()
    try:
        done = subprocess.run(
            [cli, "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json",
             "--max-examples", "10", "--seed", "1", "--no-color"],
            capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
        )  # fmt: skip
    finally:
        server.stop()
    summary = done.stdout[-3000:]
    print(summary)
    assert done.returncode == 0, summary
    assert " passed" in summary and "generated" in summary, summary
