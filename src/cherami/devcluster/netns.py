"""Hosts in Linux network namespaces: a test network on one machine, and a Cherami cluster
over it (``cherami cluster up --netns``, and the tests that cross a network).

The network itself (a bridge and a namespace per host, iptables cuts, delays, cgroup CPU
quotas) is ``Network`` in network.py, and what it leaves on the machine and its teardown
are in netstate.py; this module re-exports their public names.

``NetnsCluster`` is ``LocalCluster`` with each role process on a host of its own: it
listens on 0.0.0.0 in its namespace and advertises ``<its address>:<port>``; the frontend
URL is reachable from the root namespace through the bridge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from cherami.devcluster.local import LocalCluster, RoleProc
from cherami.devcluster.netstate import NetnsError, leftovers, sweep_stale, teardown_state
from cherami.devcluster.network import ROOT, Host, Network

__all__ = [
    "HOST_PORT", "ROOT", "Host", "NetnsCluster", "NetnsError", "Network", "leftovers",
    "sweep_stale", "teardown_state",
]  # fmt: skip

HOST_PORT = 7000  # every host has a namespace of its own, so every role can use one port


class NetnsCluster(LocalCluster):
    """``LocalCluster`` with every role process on a host of its own. ``zones`` are dealt
    to each role's processes in turn (storehost-0 in the first zone, storehost-1 in the
    second, ...); ``cpu_quota`` caps every host (in CPUs) or the named ones."""

    def __init__(
        self,
        root: Path,
        metadata: str,
        counts: dict[str, int] | None = None,
        frontend_port: int = 8080,
        extra_args: list[str] | None = None,
        zones: list[str] | None = None,
        cpu_quota: float | dict[str, float] | None = None,
        network: Network | None = None,
        keep: bool = False,
    ) -> None:
        """``keep``: the hosts outlive this process (see ``Network``)."""
        super().__init__(root, metadata, counts, frontend_port or 8080, extra_args)
        zones = zones or ["default"]
        self.zones: dict[str, str] = {}
        for role in {p.role for p in self.procs.values()}:
            for i, name in enumerate(self.names(role)):
                self.zones[name] = zones[i % len(zones)]
        self.network = network or Network(self.zones, cpu_quota, keep=keep)
        self._zone_flag: bool | None = None
        self._stopped = False

    def up(self, timeout: float = 60.0) -> None:
        """Build the network (unless it is up), then start every role as LocalCluster does.
        A PostgreSQL metadata URL on loopback is reached through a relay on the gateway."""
        self.network.up()
        self.metadata = _reachable(self.network, self.metadata)
        for name, proc in self.procs.items():
            port = proc.port or HOST_PORT
            proc.port = port
            proc.advertise = f"{self.network.hosts[name].ip}:{port}"
        super().up(timeout)

    def _spawn(self, proc: RoleProc) -> None:
        proc.data_dir.mkdir(parents=True, exist_ok=True)
        proc.log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "cherami.cli.main", "serve", "--role", proc.role,
            "--metadata", self.metadata, "--data-dir", str(proc.data_dir),
            "--host", "0.0.0.0", "--port", str(proc.port), "--advertise", proc.advertise or "",
            "--allow-remote-without-auth", *self.extra_args,
        ]  # fmt: skip
        if self._has_zone_flag():
            cmd += ["--zone", self.zones[proc.name]]
        proc.log_offset = proc.log.stat().st_size if proc.log.exists() else 0
        with open(proc.log, "ab") as log:
            proc.popen = self.network.run(
                proc.name, cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc.pid = proc.popen.pid

    def _has_zone_flag(self) -> bool:
        if self._zone_flag is None:
            out = subprocess.run(
                [sys.executable, "-m", "cherami.cli.main", "serve", "--help"],
                capture_output=True, text=True,
            )  # fmt: skip
            self._zone_flag = "--zone" in out.stdout
        return self._zone_flag

    def save(self) -> None:
        super().save()
        path = self.root / "cluster.json"
        state = json.loads(path.read_text())
        state["netns"] = self.network.state()
        state["zones"] = self.zones
        path.write_text(json.dumps(state, indent=2))

    def down(self, timeout: float = 20.0) -> None:
        """Stop every role, then tear the network down (even if stopping failed). A
        second call does nothing (the old pids may belong to other processes by then)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            super().down(timeout)
        finally:
            self.network.teardown()


def _reachable(network: Network, metadata: str) -> str:
    """``metadata`` as the hosts can reach it: a PostgreSQL URL on loopback (which the
    namespaces do not share) goes through a relay on the gateway."""
    url = urlsplit(metadata)
    if not url.scheme.startswith("postgres") or url.hostname not in ("127.0.0.1", "localhost"):
        return metadata
    relay = network.relay(f"127.0.0.1:{url.port or 5432}")
    user = url.netloc.rsplit("@", 1)[0] + "@" if "@" in url.netloc else ""
    return urlunsplit(url._replace(netloc=user + relay))


# ``python -m cherami.devcluster.netns relay LISTEN_HOST TARGET_HOST:PORT``


def _relay(listen: str, target: str) -> None:
    import asyncio

    host, port = target.rsplit(":", 1)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def main() -> None:
        server = await asyncio.start_server(handle, listen, 0)
        bound = server.sockets[0].getsockname()
        print(f"relay {bound[0]}:{bound[1]}", flush=True)
        await server.serve_forever()

    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1:2] == ["relay"]:
        _relay(sys.argv[2], sys.argv[3])
