"""A local multi-process cluster on loopback: ``cherami cluster up`` / ``cluster down``,
and the harness of the fault tests. Each process logs to ROOT/logs/NAME.log; the
cluster's pids and addresses are kept in ROOT/cluster.json."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cherami.devcluster.nodeproc import wait_healthy
from cherami.errors import Unavailable
from cherami.wire import handshake

_LISTENING = re.compile(r"listening on https?://(\S+)")
ORDER = ("storehost", "controller", "inputhost", "outputhost", "frontend")


@dataclass
class RoleProc:
    name: str
    role: str
    data_dir: Path
    log: Path
    port: int = 0
    pid: int = 0
    address: str = ""
    log_offset: int = 0  # where this run's lines start in the log
    advertise: str | None = None  # another address to announce (e.g. a proxy in front)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class LocalCluster:
    def __init__(
        self,
        root: Path,
        metadata: str,
        counts: dict[str, int] | None = None,
        frontend_port: int = 0,
        extra_args: list[str] | None = None,
    ) -> None:
        self.root = root
        self.metadata = metadata
        self.counts = counts or {
            "storehost": 3, "controller": 2, "inputhost": 2, "outputhost": 2, "frontend": 1,
        }  # fmt: skip
        self.frontend_port = frontend_port
        # every process of the cluster proves this secret on its internal links
        self.secret_file = root / "cluster.secret"
        if not self.secret_file.exists():
            root.mkdir(parents=True, exist_ok=True)
            self.secret_file.write_text(handshake.new_secret() + "\n")
            self.secret_file.chmod(0o600)
        self.extra_args = [
            *(extra_args or []), "--cluster-secret-file", str(self.secret_file.resolve()),
        ]  # fmt: skip
        self.procs: dict[str, RoleProc] = {}
        for role in ORDER:
            for i in range(self.counts.get(role, 0)):
                name = f"{role}-{i}"
                self.procs[name] = RoleProc(
                    name, role, root / name, root / "logs" / f"{name}.log",
                    port=frontend_port if role == "frontend" and i == 0 else 0,
                )  # fmt: skip

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.procs['frontend-0'].address}"

    @property
    def scheme(self) -> str:
        return "https" if "--tls-cert" in self.extra_args else "http"

    @property
    def ca(self) -> Path | None:
        """The CA given with --tls-ca (it verifies the frontend's https)."""
        args = self.extra_args
        return Path(args[args.index("--tls-ca") + 1]) if "--tls-ca" in args else None

    def names(self, role: str) -> list[str]:
        return [n for n, p in self.procs.items() if p.role == role]

    def up(self, timeout: float = 60.0) -> None:
        """Start every process; one that exits or does not come up stops the others
        started (nothing is left running behind the error)."""
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        try:
            for role in ORDER:
                names = self.names(role)
                for name in names:
                    self._spawn(self.procs[name])
                for name in names:
                    self._wait_listening(self.procs[name], timeout)
            self._wait_healthy(timeout)
        except BaseException:
            self.down()
            raise
        self.save()

    def _spawn(self, proc: RoleProc) -> None:
        proc.data_dir.mkdir(parents=True, exist_ok=True)
        proc.log.parent.mkdir(parents=True, exist_ok=True)
        port = proc.port
        if proc.address and proc.role != "frontend":
            port = int(proc.address.rsplit(":", 1)[1])  # a restart keeps its address
        cmd = [
            sys.executable, "-m", "cherami.cli.main", "serve", "--role", proc.role,
            "--metadata", self.metadata, "--data-dir", str(proc.data_dir),
            "--host", "127.0.0.1", "--port", str(port), *self.extra_args,
        ]  # fmt: skip
        if proc.advertise:
            cmd += ["--advertise", proc.advertise]
        proc.log_offset = proc.log.stat().st_size if proc.log.exists() else 0
        with open(proc.log, "ab") as log:
            proc.popen = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc.pid = proc.popen.pid

    def _wait_listening(self, proc: RoleProc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise Unavailable(f"{proc.name} exited; see {proc.log}")
            with open(proc.log, "rb") as log:
                log.seek(proc.log_offset)
                matches = _LISTENING.findall(log.read().decode(errors="replace"))
            if matches:
                proc.address = matches[-1]
                return
            time.sleep(0.05)
        raise Unavailable(f"{proc.name} did not start; see {proc.log}")

    def _wait_healthy(self, timeout: float) -> None:
        if not wait_healthy(self.url, time.monotonic() + timeout, self.ca):
            raise Unavailable("the frontend never became healthy")

    # faults
    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.procs[name].pid, sig)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        self.signal(name, signal.SIGKILL)
        if proc.popen is not None:
            proc.popen.wait(10)

    def restart(self, *names: str, timeout: float = 60.0) -> None:
        """Start the named processes again, all at once (machines that come back from a
        power loss together), and wait until each listens."""
        for name in names:
            self._spawn(self.procs[name])
        for name in names:
            self._wait_listening(self.procs[name], timeout)

    def leader(self) -> str | None:
        """The name of the controller that says it leads (from its log)."""
        for name in self.names("controller"):
            lines = [
                line for line in self.procs[name].log.read_text(errors="replace").splitlines()
                if " leads" in line or " follows" in line
            ]  # fmt: skip
            if lines and lines[-1].endswith("leads"):
                return name
        return None

    # lifecycle
    def save(self) -> None:
        state = {
            "metadata": self.metadata,
            "url": self.url,
            "procs": {
                n: {"role": p.role, "pid": p.pid, "address": p.address}
                for n, p in self.procs.items()
            },
        }
        (self.root / "cluster.json").write_text(json.dumps(state, indent=2))

    def down(self, timeout: float = 20.0) -> None:
        for proc in self.procs.values():
            _terminate(proc.pid)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            _wait_gone(proc, deadline)


def _terminate(pid: int) -> None:
    if pid:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _wait_gone(proc: RoleProc, deadline: float) -> None:
    if not proc.pid:
        return  # never started
    if proc.popen is not None:
        try:
            proc.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(5)
        return
    while time.monotonic() < deadline:
        try:
            os.kill(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def down_from_state(root: Path) -> int:
    """Stop the cluster recorded in ROOT/cluster.json; returns how many processes."""
    state = json.loads((root / "cluster.json").read_text())
    procs = [
        RoleProc(n, p["role"], root / n, root / "logs" / f"{n}.log", pid=p["pid"])
        for n, p in state["procs"].items()
    ]
    for proc in procs:
        _terminate(proc.pid)
    deadline = time.monotonic() + 20
    for proc in procs:
        _wait_gone(proc, deadline)
    (root / "cluster.json").unlink()
    return len(procs)
