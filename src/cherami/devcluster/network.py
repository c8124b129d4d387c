"""A test network of Linux network namespaces on one machine (netns.py runs a Cherami
cluster over it).

``Network`` makes a bridge in the root namespace (``chbr<id>``, the gateway ``.1`` of a
free 10.213.N.0/24) and one namespace per host (``ch<id>-<name>``) joined to it by a veth
pair, with its own address, loopback up and a zone label. A host may get a CPU quota (a
cgroup of its own, v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``); ``run`` starts a process
inside the host's namespace and cgroup. ``delay`` adds latency between zones (``tc
netem`` where the kernel has it, otherwise NFQUEUE and ``cherami.devcluster.netdelay``),
``cut``/``heal`` drop and restore the traffic between hosts or zones with iptables
(``ROOT`` names the root namespace: what runs on the gateway, such as a metadata store or
a test's clients); ``isolate`` cuts a zone off from everything else.
``teardown`` removes everything it made (netstate.py); it is idempotent and registered
with atexit. Needs root, iproute2 and iptables."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cherami.devcluster.netstate import (
    CGROUP_V1,
    CGROUP_V2,
    STATE_DIR,
    NetnsError,
    kill_and_wait,
    leftovers,
    sh,
    start_time,
    sweep_stale,
    teardown_state,
)

ROOT = "root"  # in cut(): the root namespace, reached at the gateway address
SUBNET_PREFIX = "10.213"
_PERIOD_US = 100_000


@dataclass
class Host:
    name: str
    zone: str
    ns: str  # the namespace
    ip: str
    veth: str  # the root-side end of its veth pair, on the bridge
    cgroup: str = ""  # the host's cgroup directory when it has a CPU quota


class Network:
    """A bridge and one namespace per host. ``hosts`` maps each host name to its zone."""

    def __init__(
        self,
        hosts: dict[str, str],
        cpu_quota: float | dict[str, float] | None = None,
        run_id: str | None = None,
        keep: bool = False,
    ) -> None:
        """``keep``: the network outlives this process (``cherami cluster up --netns``):
        no teardown at exit, and no later run removes it as stale."""
        self.id = run_id or f"{random.getrandbits(24):06x}"
        self.keep = keep
        self.bridge = f"chbr{self.id}"
        self.subnet = ""
        self.gateway = ""
        self.cgroup_version = ""
        self.cgroup_root = ""  # this network's cgroup directory (parent of the hosts')
        self.forward_rule = False
        self.delays: dict[tuple[str, str], float] = {}  # (from zone, to zone) -> ms
        self.cuts: set[tuple[str, str]] = set()  # unordered host pairs
        self.delayers: dict[str, int] = {}  # namespace -> pid of its netdelay
        self.relays: list[int] = []
        self.netem: bool | None = None
        self._zones = dict(hosts)
        self._quota = cpu_quota
        self.hosts: dict[str, Host] = {}
        self._up = False
        self._down = False

    # building
    def up(self) -> Network:
        if self._up:
            return self
        self._up = True
        if not self.keep:
            atexit.register(self.teardown)
        sweep_stale()
        try:
            self._record()
            self._build()
            self._record()
        except BaseException:
            self.teardown()
            raise
        return self

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *_: object) -> None:
        self.teardown()

    def _build(self) -> None:
        for tool in ("ip", "iptables"):
            if shutil.which(tool) is None:
                raise NetnsError(f"{tool} is not installed (apt-get install iproute2 iptables)")
        if len(self._zones) > 250:
            raise NetnsError("at most 250 hosts")
        with _subnet_lock():  # two networks built at once must not pick the same subnet
            self.subnet = _free_subnet()
            net = ipaddress.ip_network(self.subnet)
            self.gateway = str(net[1])
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        # with br_netfilter, bridged frames pass the root FORWARD chain (Docker drops them)
        sh("iptables", "-w", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
        self.forward_rule = True
        for i, (name, zone) in enumerate(self._zones.items()):
            host = Host(name, zone, f"ch{self.id}-{name}", str(net[2 + i]), f"ch{self.id}v{i}")
            self.hosts[name] = host
            sh("ip", "netns", "add", host.ns)
            sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                "netns", host.ns)  # fmt: skip
            sh("ip", "link", "set", host.veth, "master", self.bridge, "up")
            sh("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            sh("ip", "-n", host.ns, "link", "set", "eth0", "up")
            sh("ip", "-n", host.ns, "link", "set", "lo", "up")
            sh("ip", "-n", host.ns, "route", "add", "default", "via", self.gateway)
            for chain in ("INPUT", "OUTPUT"):
                self.ipt(name, "-N", f"CH{chain}")
                self.ipt(name, "-A", chain, "-j", f"CH{chain}")
            self.ipt(name, "-t", "mangle", "-N", "CHDELAY")
            self.ipt(name, "-t", "mangle", "-A", "POSTROUTING", "-j", "CHDELAY")
        quotas = self._quota if isinstance(self._quota, dict) else {
            name: self._quota for name in self.hosts if self._quota
        }  # fmt: skip
        for name, quota in quotas.items():
            if quota:
                self._set_quota(self.hosts[name], quota)

    def _set_quota(self, host: Host, cpus: float) -> None:
        if not self.cgroup_root:
            self.cgroup_version, base = _cgroup_base()
            root = base / f"cherami-{self.id}"
            root.mkdir()
            self.cgroup_root = str(root)
            if self.cgroup_version == "v2":
                (base / "cgroup.subtree_control").write_text("+cpu")
                (root / "cgroup.subtree_control").write_text("+cpu")
        group = Path(self.cgroup_root) / host.name
        group.mkdir()
        quota = max(1000, int(cpus * _PERIOD_US))
        if self.cgroup_version == "v1":
            (group / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
        host.cgroup = str(group)

    # use
    def run(self, name: str, argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the host's namespace (and its cgroup, if it has one). The
        Popen's pid is the process itself (``ip netns exec`` and the shell exec it)."""
        host = self.hosts[name]
        prefix = ["ip", "netns", "exec", host.ns]
        if host.cgroup:  # joined before ip netns exec, which mounts a /sys of its own
            procs = Path(host.cgroup) / "cgroup.procs"
            prefix = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *prefix]
        return subprocess.Popen([*prefix, *argv], **popen)

    def exec(self, name: str, *argv: str, check: bool = True) -> str:
        """Run a command in the host's namespace and return its output."""
        return sh("ip", "netns", "exec", self.hosts[name].ns, *argv, check=check)

    def ipt(self, name: str, *args: str) -> None:
        self.exec(name, "iptables", "-w", *args)

    def address(self, name: str) -> str:
        """The host's IPv4 address as its namespace reports it (not as recorded)."""
        out = sh("ip", "-n", self.hosts[name].ns, "-4", "-o", "addr", "show", "dev", "eth0")
        match = re.search(r"inet (\S+)/", out)
        if not match:
            raise NetnsError(f"{name} has no IPv4 address")
        return match.group(1)

    def zone_hosts(self, name: str) -> list[str]:
        """The hosts of a zone, or ``[name]`` for a host (or ``ROOT``)."""
        if name in self.hosts or name == ROOT:
            return [name]
        found = [h.name for h in self.hosts.values() if h.zone == name]
        if not found:
            raise KeyError(f"no host or zone {name!r}")
        return found

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between ``a`` and ``b`` (hosts, zones or ``ROOT``), both
        ways, in the hosts' namespaces, so open connections stall as on a real partition.
        ``ROOT`` is the root namespace at the gateway address (rules only on the host's
        side: the root namespace is left as it is)."""
        for x in self.zone_hosts(a):
            for y in self.zone_hosts(b):
                if x == y or (x, y) in self.cuts or (y, x) in self.cuts:
                    continue
                self.cuts.add((x, y))
                for me, peer in ((x, y), (y, x)):
                    if me == ROOT:
                        continue
                    ip = self.gateway if peer == ROOT else self.hosts[peer].ip
                    self.ipt(me, "-A", "CHINPUT", "-s", ip, "-j", "DROP")
                    self.ipt(me, "-A", "CHOUTPUT", "-d", ip, "-j", "DROP")

    def isolate(self, zone: str) -> None:
        """Cut ``zone`` (or a host) off from every other host and from the root
        namespace (a metadata store or clients on the gateway): a zone lost whole."""
        inside = set(self.zone_hosts(zone))
        for other in [*sorted(set(self.hosts) - inside), ROOT]:
            self.cut(zone, other)

    def heal(self, everywhere: bool = False) -> None:
        """Undo every ``cut`` (``everywhere``: on every host, also those cut by another
        process, such as ``cherami cluster cut``)."""
        names = set(self.hosts) if everywhere else {n for pair in self.cuts for n in pair}
        for name in sorted(names - {ROOT}):
            self.ipt(name, "-F", "CHINPUT")
            self.ipt(name, "-F", "CHOUTPUT")
        self.cuts.clear()

    def delay(self, zone_a: str, zone_b: str, ms: float) -> None:
        """Delay every packet between the two zones by ``ms`` each way (a round trip
        gains 2 x ``ms``); 0 removes the delay. Applies to packets sent from now on."""
        for x, y in ((zone_a, zone_b), (zone_b, zone_a)):
            if ms > 0:
                self.delays[(x, y)] = ms
            else:
                self.delays.pop((x, y), None)
        for name in self.zone_hosts(zone_a) + self.zone_hosts(zone_b):
            self._apply_delays(self.hosts[name])

    def _apply_delays(self, host: Host) -> None:
        if self.netem is None:
            self.netem = _has_netem(self)
        toward = {z: ms for (src, z), ms in self.delays.items() if src == host.zone}
        if self.netem:
            self._apply_netem(host, toward)
            return
        self.ipt(host.name, "-t", "mangle", "-F", "CHDELAY")
        self._stop_delayer(host.ns)
        if not toward:
            return
        queues: list[str] = []
        for i, (zone, ms) in enumerate(sorted(toward.items()), start=1):
            queues.append(f"{i}:{ms}")
            for peer in self.zone_hosts(zone):
                self.ipt(host.name, "-t", "mangle", "-A", "CHDELAY", "-d", self.hosts[peer].ip,
                         "-j", "NFQUEUE", "--queue-num", str(i), "--queue-bypass")  # fmt: skip
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, sys.executable, "-m", "cherami.devcluster.netdelay",
             *queues],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.delayers[host.ns] = proc.pid
        self._record()
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "netdelay ready" once its queues are bound
        proc.stdout.close()
        if not line.startswith(b"netdelay ready"):
            raise NetnsError(f"the delayer in {host.ns} did not start")

    def _apply_netem(self, host: Host, toward: dict[str, float]) -> None:
        self.exec(host.name, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        if not toward:
            return
        self.exec(host.name, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:",
                  "htb", "default", "1")  # fmt: skip
        self.exec(host.name, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid",
                  "1:1", "htb", "rate", "10gbit")  # fmt: skip
        for i, (zone, ms) in enumerate(sorted(toward.items()), start=2):
            self.exec(host.name, "tc", "class", "add", "dev", "eth0", "parent", "1:",
                      "classid", f"1:{i}", "htb", "rate", "10gbit")  # fmt: skip
            self.exec(host.name, "tc", "qdisc", "add", "dev", "eth0", "parent", f"1:{i}",
                      "netem", "delay", f"{ms}ms")  # fmt: skip
            for peer in self.zone_hosts(zone):
                self.exec(host.name, "tc", "filter", "add", "dev", "eth0", "parent", "1:",
                          "protocol", "ip", "u32", "match", "ip", "dst",
                          f"{self.hosts[peer].ip}/32", "flowid", f"1:{i}")  # fmt: skip

    def _stop_delayer(self, ns: str) -> None:
        pid = self.delayers.pop(ns, 0)
        if pid:
            kill_and_wait([pid], signal.SIGTERM)

    def relay(self, target: str) -> str:
        """Forward TCP from the gateway to ``target`` (HOST:PORT in the root namespace, such
        as a database on 127.0.0.1): returns the GATEWAY:PORT the hosts can use."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "cherami.devcluster.netns", "relay", self.gateway, target],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.relays.append(proc.pid)
        self._record()
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        proc.stdout.close()
        if not line.startswith("relay "):
            raise NetnsError(f"the relay to {target} did not start")
        return line.split()[1]

    @classmethod
    def attach(cls, state: dict[str, Any]) -> Network:
        """The network that ``state`` (``Network.state()``, kept in a cluster's
        cluster.json) describes, built by another process, to cut and heal it. This
        object never tears it down."""
        network = cls({n: h["zone"] for n, h in state["hosts"].items()}, run_id=state["id"],
                      keep=True)  # fmt: skip
        network.subnet, network.gateway = state["subnet"], state["gateway"]
        network.hosts = {n: Host(**h) for n, h in state["hosts"].items()}
        network._up = network._down = True
        return network

    # teardown
    def teardown(self) -> None:
        """Remove every namespace, veth, rule, cgroup and process this network made.
        Idempotent; never raises for something already gone."""
        if self._down:
            return
        self._down = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)
        teardown_state(self.state())
        self.delayers.clear()
        self.relays.clear()

    def state(self) -> dict[str, Any]:
        """Everything ``teardown_state`` needs, as JSON-ready data."""
        return {
            "id": self.id, "bridge": self.bridge, "subnet": self.subnet,
            "gateway": self.gateway, "forward_rule": self.forward_rule,
            "cgroup_version": self.cgroup_version, "cgroup_root": self.cgroup_root,
            "delayers": list(self.delayers.values()), "relays": self.relays,
            "hosts": {n: asdict(h) for n, h in self.hosts.items()},
        }  # fmt: skip

    def leftovers(self) -> list[str]:
        """What of this network is still on the machine (empty after ``teardown``)."""
        return leftovers(self.id)

    def _record(self) -> None:
        owner = None if self.keep else [os.getpid(), start_time(os.getpid())]
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path = STATE_DIR / f"{self.id}.json"
        path.write_text(json.dumps({**self.state(), "owner": owner}))


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Held from choosing a subnet until the bridge has its address (other processes
    building networks look for free subnets by the addresses in use)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "subnet.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _free_subnet() -> str:
    used = sh("ip", "-4", "-o", "addr", "show") + sh("ip", "-4", "route", "show")
    taken = {int(n) for n in re.findall(rf"\b{re.escape(SUBNET_PREFIX)}\.(\d+)\.", used)}
    free = [n for n in range(1, 255) if n not in taken]
    if not free:
        raise NetnsError(f"no free {SUBNET_PREFIX}.N.0/24")
    return f"{SUBNET_PREFIX}.{random.choice(free)}.0/24"


def _cgroup_base() -> tuple[str, Path]:
    if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
        return "v1", CGROUP_V1
    for base in CGROUP_V2:
        controllers = base / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return "v2", base
    raise NetnsError("no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max)")


def _has_netem(network: Network) -> bool:
    name = next(iter(network.hosts))
    out = subprocess.run(
        ["ip", "netns", "exec", network.hosts[name].ns, "tc", "qdisc", "add", "dev", "lo",
         "root", "netem", "delay", "1ms"], capture_output=True,
    )  # fmt: skip
    sh("ip", "netns", "exec", network.hosts[name].ns, "tc", "qdisc", "del", "dev", "lo",
        "root", check=False)  # fmt: skip
    return out.returncode == 0
