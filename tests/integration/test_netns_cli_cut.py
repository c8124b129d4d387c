"""``cherami cluster cut|isolate|heal`` on a network that another process built (as
``cluster up --netns`` leaves it): the links go down and come back. Needs root, iproute2
and iptables; a missing facility fails the test."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from cherami.devcluster.netns import Network

LISTEN = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen()
print("ready", flush=True)
while True:
    s.accept()[0].close()
"""

CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9000), timeout=1).close()
    print("reachable")
except OSError:
    print("unreachable")
"""


def _from_host(network: Network, host: str, ip: str) -> str:
    proc = network.run(host, [sys.executable, "-c", CONNECT, ip], stdout=subprocess.PIPE)
    return proc.communicate(timeout=10)[0].decode().strip()


def _from_root(ip: str) -> str:
    try:
        socket.create_connection((ip, 9000), timeout=1).close()
    except OSError:
        return "unreachable"
    return "reachable"


def _cli(root: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cherami.cli.main", "cluster", *args, "--dir", str(root)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_cli_cuts_isolates_and_heals_a_netns_cluster(tmp_path: Path) -> None:
    network = Network({"x0": "a", "x1": "b"})
    with network:
        (tmp_path / "cluster.json").write_text(json.dumps({"netns": network.state()}))
        server = network.run("x1", [sys.executable, "-c", LISTEN], stdout=subprocess.PIPE)
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        x1 = network.hosts["x1"].ip
        assert _from_host(network, "x0", x1) == "reachable"

        _cli(tmp_path, "cut", "x0", "b")
        assert _from_host(network, "x0", x1) == "unreachable"
        assert _from_root(x1) == "reachable"  # only the pair was cut
        _cli(tmp_path, "heal")
        assert _from_host(network, "x0", x1) == "reachable"

        _cli(tmp_path, "isolate", "b")
        assert _from_host(network, "x0", x1) == "unreachable"
        assert _from_root(x1) == "unreachable"  # from the root namespace too
        _cli(tmp_path, "heal")
        assert _from_host(network, "x0", x1) == "reachable"
        assert _from_root(x1) == "reachable"
    assert network.leftovers() == []
    assert server.wait(5) is not None
