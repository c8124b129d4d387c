"""A node (``cherami serve``, every role) as a child process on a free loopback port:
what the demo, the benchmarks and the integration tests start."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path

_LISTENING = re.compile(rb"listening on (https?)://([\d.]+):(\d+)")


def wait_healthy(
    url: str, deadline: float, ca: Path | None = None, seen: list[str] | None = None
) -> bool:
    """Poll ``url``/healthz until it answers 200 or the monotonic ``deadline`` passes
    (an https URL is verified with the CA certificate ``ca``); ``seen`` gets the last
    answer or error, for the message of a caller that gives up."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2, context=context) as resp:
                if resp.status == 200:
                    return True
        except OSError as e:  # HTTPError (a 503 "starting") is one too
            if seen is not None:
                seen[:] = [f"{type(e).__name__}: {e}"]
        time.sleep(0.05)
    return False


class NodeProcess:
    def __init__(
        self,
        data_dir: Path,
        stores: int = 3,
        extra: list[str] | None = None,
        ca: Path | None = None,
    ) -> None:
        """``ca``: the CA that signed the node's --tls-cert (a node serving https)."""
        self.data_dir = data_dir
        self.ca = ca
        self.stores = stores
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.output: deque[str] = deque(maxlen=400)

    def start(self, timeout: float = 60.0) -> NodeProcess:
        """Start it and wait until ``/healthz`` answers 200; raises RuntimeError if not."""
        cmd = [
            sys.executable, "-m", "cherami.cli.main", "serve", "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1", "--port", "0", "--stores", str(self.stores), *self.extra,
        ]  # fmt: skip
        # a node of its own: its secret is the one in its data directory, never one a
        # Spark session's environment names (CHERAMI_CLUSTER_SECRET[_FILE])
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_CLUSTER_SECRET")}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env=env,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the node exited:\n" + "\n".join(self.output))
            self.output.append(line.decode(errors="replace").rstrip())
            match = _LISTENING.search(line)
            if match:
                scheme, host, port = (g.decode() for g in match.groups())
                self.url = f"{scheme}://{host}:{int(port)}"
                threading.Thread(target=self._drain, daemon=True).start()
                seen: list[str] = []
                if not wait_healthy(self.url, deadline, self.ca, seen):
                    raise RuntimeError(
                        f"the node never became healthy within {timeout:.0f} s (last "
                        f"/healthz: {seen or 'no answer'}); its output:\n"
                        + "\n".join(list(self.output))
                    )
                return self
        raise RuntimeError("the node did not start:\n" + "\n".join(self.output))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.decode(errors="replace").rstrip())

    def kill(self) -> None:
        """SIGKILL the node (its store hosts die with it)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._wait_children_gone()

    def _wait_children_gone(self) -> None:
        deadline = time.monotonic() + 10
        pattern = f"cherami.roles.storehost --data-dir {self.data_dir}"
        while time.monotonic() < deadline:
            if subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode != 0:
                return
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return -9
