"""What a network of namespaces (network.py) leaves on the machine, and removing it.

Each live network keeps a JSON file in ``STATE_DIR`` (``Network.state()`` and its
owner's pid and start time). ``teardown_state`` removes what such a state describes:
the processes in its namespaces and cgroups, then the namespaces, veths, bridge, root
iptables rule and cgroups, going on when something is already gone. ``sweep_stale``
tears down the networks whose owner is gone (a run killed before its teardown);
``leftovers`` lists what of a network is still there."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
# one JSON file per live network, so that the next run removes what a killed one left
STATE_DIR = Path(os.environ.get("CHERAMI_NETNS_STATE", "/run/cherami-netns"))


class NetnsError(RuntimeError):
    """A command that builds or changes the network failed."""


def sh(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def sweep_stale() -> list[str]:
    """Tear down the networks whose owning process is gone (a run that was killed before
    its teardown); returns their ids. Kept networks (``keep=True``) are left alone."""
    swept = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        owner = state.get("owner")
        if owner and start_time(owner[0]) != owner[1]:
            teardown_state(state)
            swept.append(state["id"])
    return swept


def start_time(pid: int) -> str:
    """When ``pid`` started (in clock ticks since boot), or "" if it is gone: a pid with
    another start time is another process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def teardown_state(state: dict[str, Any]) -> None:
    """Remove the network described by ``Network.state()``: kill the processes in its
    namespaces and cgroups, then delete namespaces, veths, the bridge, the root rule and
    the cgroups. Every step goes on when something is already gone."""
    run_id = state["id"]
    pids = [*state.get("delayers", []), *state.get("relays", [])]
    hosts = state.get("hosts", {})
    for host in hosts.values():
        pids += _ns_pids(host["ns"])
        if host.get("cgroup"):
            pids += _cgroup_pids(Path(host["cgroup"]))
    kill_and_wait(pids, signal.SIGKILL)
    for ns in _namespaces(run_id):
        sh("ip", "netns", "del", ns, check=False)
    for link in _links(run_id):
        sh("ip", "link", "del", link, check=False)
    if state.get("forward_rule"):
        bridge = state["bridge"]
        sh("iptables", "-w", "-D", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT",
            check=False)  # fmt: skip
    root = state.get("cgroup_root")
    if root and Path(root).exists():
        for group in Path(root).iterdir():
            if group.is_dir():
                _rmdir(group)
        _rmdir(Path(root))
    (STATE_DIR / f"{run_id}.json").unlink(missing_ok=True)


def leftovers(run_id: str) -> list[str]:
    found = [f"netns {ns}" for ns in _namespaces(run_id)]
    found += [f"link {link}" for link in _links(run_id)]
    found += [f"cgroup {p}" for p in _cgroup_dirs(run_id)]
    if f"chbr{run_id}" in sh("iptables", "-w", "-S", "FORWARD", check=False):
        found.append(f"iptables FORWARD rule for chbr{run_id}")
    return found


def _namespaces(run_id: str) -> list[str]:
    out = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines()
            if line.startswith(f"ch{run_id}-")]  # fmt: skip


def _links(run_id: str) -> list[str]:
    out = sh("ip", "-o", "link", "show", check=False)
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]
    return [n for n in names if n in (f"chbr{run_id}",) or n.startswith(f"ch{run_id}v")]


def _cgroup_dirs(run_id: str) -> list[Path]:
    bases = [CGROUP_V1, *CGROUP_V2]
    return [b / f"cherami-{run_id}" for b in bases if (b / f"cherami-{run_id}").exists()]


def _ns_pids(ns: str) -> list[int]:
    out = sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _cgroup_pids(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def kill_and_wait(pids: list[int], sig: signal.Signals, timeout: float = 10.0) -> None:
    pids = [p for p in set(pids) if p > 1 and p != os.getpid()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a child of ours is reaped; a zombie counts as gone)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return False
    return stat.rsplit(") ", 1)[-1][:1] != "Z"


def _rmdir(path: Path) -> None:
    for _ in range(100):  # a cgroup empties a moment after its last process dies
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
