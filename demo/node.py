"""Start and stop a Cherami node (``cherami serve``) as a child process."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path

_LISTENING = re.compile(rb"listening on (http://[\d.]+:\d+)")


class LocalNode:
    """A node on the embedded default (RocksDB store hosts and SQLite) on a free port."""

    def __init__(self, data_dir: Path, stores: int = 3) -> None:
        self.data_dir = data_dir
        self.stores = stores
        self.url = ""
        self.output: deque[str] = deque(maxlen=200)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> LocalNode:
        cmd = [
            sys.executable, "-m", "cherami.cli.main", "serve", "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1", "--port", "0", "--stores", str(self.stores),
        ]  # fmt: skip
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        while not self.url:
            line = self._proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the node did not start:\n" + "\n".join(self.output))
            self.output.append(line.decode(errors="replace").rstrip())
            match = _LISTENING.search(line)
            if match:
                self.url = match.group(1).decode()
        threading.Thread(target=self._drain, daemon=True).start()
        self._wait_healthy(deadline)
        return self

    def _drain(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.output.append(line.decode(errors="replace").rstrip())

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the node never became healthy")

    def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
