"""Start ``cherami serve`` as a real process on a free loopback port."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path

import httpx

_LISTENING = re.compile(rb"listening on http://([\d.]+):(\d+)")


class ServerProcess:
    def __init__(self, data_dir: Path, stores: int = 3, extra: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.stores = stores
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.output: deque[str] = deque(maxlen=400)

    def start(self, timeout: float = 60.0) -> ServerProcess:
        cmd = [
            sys.executable, "-m", "cherami.cli.main", "serve", "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1", "--port", "0", "--stores", str(self.stores), *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("server exited:\n" + "\n".join(self.output))
            self.output.append(line.decode(errors="replace").rstrip())
            match = _LISTENING.search(line)
            if match:
                self.url = f"http://{match.group(1).decode()}:{int(match.group(2))}"
                threading.Thread(target=self._drain, daemon=True).start()
                self._wait_healthy(deadline)
                return self
        raise RuntimeError("server did not start:\n" + "\n".join(self.output))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.decode(errors="replace").rstrip())

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server never became healthy")

    def kill(self) -> None:
        """SIGKILL the node (its store hosts die with it)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._wait_children_gone()

    def _wait_children_gone(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["pgrep", "-f", f"cherami.roles.storehost --data-dir {self.data_dir}"],
                capture_output=True,
            )
            if out.returncode != 0:
                return
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return -9


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
