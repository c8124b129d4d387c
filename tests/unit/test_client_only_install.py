"""`pip install cherami` (no extras) gives the client and the CLI: neither imports a
server-only package, and `cherami serve` then says in one line what to install."""

from __future__ import annotations

import subprocess
import sys

SERVER_ONLY = ("rocksdict", "uvloop", "psycopg", "psycopg_pool", "prometheus_client",
               "swagger_ui_bundle")  # fmt: skip

PROBE = f"""
import importlib.abc, sys
class NoServer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, NoServer())
from cherami import AsyncClient, Client, OutgoingMessage
from click.testing import CliRunner
from cherami.cli import main
main.main.__globals__  # the CLI's modules load
from cherami.cli import cluster, clusterstatus, commands, keys, top
result = CliRunner().invoke(main.cli, ["queue", "--help"])
assert result.exit_code == 0, result.output
served = CliRunner().invoke(main.cli, ["serve", "--port", "0"])
print(served.exit_code, served.output.strip())
"""


def test_the_client_and_cli_need_no_server_package() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    code, _, message = done.stdout.strip().partition(" ")
    assert code == "1" and "pip install 'cherami[server]'" in message, done.stdout
