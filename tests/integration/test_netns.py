"""Hosts in their own Linux network namespaces (cherami.devcluster.netns): the network itself
(addresses, zone delay, cuts, a CPU quota, teardown) and a cluster of nine hosts on their
own addresses, with a private PostgreSQL on the bridge as the metadata store. Needs root,
iproute2 and iptables; a missing facility fails these tests, never skips them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.netns import HOST_PORT, NetnsCluster, Network, leftovers
from cherami.errors import CheramiError
from tests.support.checker import QueueHistory
from tests.support.pg import PrivatePostgres

COUNTS = {"storehost": 3, "controller": 1, "inputhost": 2, "outputhost": 2, "frontend": 1}

ECHO = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    while data := c.recv(100):
        c.sendall(data)
    c.close()
"""

RTT = """
import socket, sys, time
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
except OSError:
    print("unreachable"); raise SystemExit
if len(sys.argv) > 3:
    print("reachable"); raise SystemExit
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(5):
    t = time.monotonic(); s.sendall(b"x"); s.recv(1); times.append(time.monotonic() - t)
print(min(times) * 1000)
"""

SPIN = """
import time
end = time.monotonic() + 1.0
while time.monotonic() < end:
    pass
print(time.process_time())
"""


def _out(network: Network, host: str, script: str, *args: str) -> str:
    proc = network.run(host, [sys.executable, "-c", script, *args], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=20)
    return out.decode().strip()


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def _reachable(network: Network, host: str, ip: str, port: int) -> bool:
    return _out(network, host, RTT, ip, str(port), "connect-only") == "reachable"


def _netns_names() -> str:
    return _ip("netns", "list")


def test_network_gives_addresses_delay_cuts_quota_and_cleans_up() -> None:
    network = Network({"a0": "a", "a1": "a", "b0": "b"}, cpu_quota={"a1": 0.1})
    with network:
        addresses = {name: network.address(name) for name in network.hosts}
        assert len(set(addresses.values())) == 3, addresses
        assert all(addresses[n] == h.ip for n, h in network.hosts.items())
        listed = _netns_names()
        assert all(h.ns in listed for h in network.hosts.values())

        echo = network.run("b0", [sys.executable, "-c", ECHO], stdout=subprocess.PIPE)
        assert echo.stdout is not None and echo.stdout.readline().strip() == b"ready"
        b0 = network.hosts["b0"].ip
        assert float(_out(network, "a0", RTT, b0, "9000")) < 10  # no delay yet

        network.delay("a", "b", 25)
        assert float(_out(network, "a0", RTT, b0, "9000")) >= 45  # 25 ms each way
        network.delay("a", "b", 0)
        assert float(_out(network, "a0", RTT, b0, "9000")) < 10

        network.cut("a0", "b")
        assert _out(network, "a0", RTT, b0, "9000") == "unreachable"
        network.heal()
        assert float(_out(network, "a0", RTT, b0, "9000")) < 10

        cpu = float(_out(network, "a1", SPIN))  # 1 s of spinning under a 0.1 CPU quota
        assert cpu < 0.3, f"the quota did not hold: {cpu:.2f} s of CPU in 1 s"
        # a host without a quota is not capped (relative: a busy machine gives it less
        # than a whole core, 0.40 s once while other suites ran, but far more than a1)
        free = float(_out(network, "a0", SPIN))
        assert free > 2 * cpu, f"uncapped {free:.2f} s of CPU vs capped {cpu:.2f} s"
        run_id = network.id
    assert network.leftovers() == []
    assert f"ch{run_id}-" not in _netns_names()
    assert echo.wait(5) is not None
    network.teardown()  # idempotent


def test_a_network_left_by_a_killed_run_is_removed_by_the_next() -> None:
    script = (
        "import time; from cherami.devcluster.netns import Network\n"
        "n = Network({'x0': 'a'}, cpu_quota=0.2).up(); print(n.id, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().decode().strip()
    proc.kill()  # no atexit, no finally
    proc.wait()
    assert leftovers(run_id), "the killed run left nothing to sweep?"
    with Network({"y0": "a"}):
        assert leftovers(run_id) == []


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    cluster = NetnsCluster(tmp_path / "cluster", "", COUNTS, zones=["a", "b", "c"])
    pg = PrivatePostgres(listen=cluster.network.up().gateway)
    try:
        pg.start()
        cluster.metadata = pg.url()
        cluster.up()
        yield cluster
    finally:
        try:
            cluster.down()
        finally:
            pg.remove()
    assert cluster.network.leftovers() == []


class Traffic:
    """Producers that retry each batch until it is acked; a drain that reads until every
    acked message was delivered or nothing came for a while."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.history = QueueHistory()
        self.stop = asyncio.Event()

    async def publish(self, worker: int, total: int | None = None, batch: int = 100) -> None:
        n = 0
        async with AsyncClient(self.url, timeout=20) as client:
            while not self.stop.is_set() and (total is None or n < total):
                bodies = [f"w{worker}-{n + i}" for i in range(batch)]
                n += batch
                self.history.attempted.update(bodies)
                while True:
                    try:
                        await client.publish(self.queue, bodies)
                        self.history.acked.update(bodies)
                        break
                    except CheramiError:
                        await asyncio.sleep(0.3)

    async def drain(self, group: str, quiet: float = 5.0, limit: float = 40.0) -> None:
        h = self.history
        deadline = time.monotonic() + limit
        last = time.monotonic()
        async with AsyncClient(self.url, timeout=20) as client:
            while time.monotonic() < deadline:
                if h.acked <= set(h.delivered) and time.monotonic() - last > 1:
                    return
                if time.monotonic() - last > quiet:
                    return
                try:
                    got = await client.receive(self.queue, group, max_messages=500,
                                               wait_seconds=1)  # fmt: skip
                    if got:
                        h.delivered.update(m.text for m in got)
                        last = time.monotonic()
                        await client.ack(self.queue, group, [m.receipt or "" for m in got])
                except CheramiError:
                    await asyncio.sleep(0.3)


@pytest.mark.timeout(120)
async def test_cluster_across_namespaces_delivers_every_acked_message(
    netns_cluster: NetnsCluster,
) -> None:
    cluster, network = netns_cluster, netns_cluster.network
    addresses = [network.address(name) for name in cluster.procs]
    assert len(set(addresses)) == 9, addresses
    listed = _netns_names()
    for name, proc in cluster.procs.items():
        host = network.hosts[name]
        assert host.ns in listed
        port = 8080 if proc.role == "frontend" else HOST_PORT
        assert proc.address == f"{host.ip}:{port}", (name, proc.address)
    assert {h.zone for h in network.hosts.values()} == {"a", "b", "c"}
    assert cluster.url == f"http://{network.hosts['frontend-0'].ip}:8080"

    async with AsyncClient(cluster.url) as client:
        await client.create_queue("spread")
        await client.create_group("spread", "g", visibility_timeout_seconds=10)
    traffic = Traffic(cluster.url, "spread")
    started = time.monotonic()
    await asyncio.gather(*(traffic.publish(w, total=1000) for w in range(2)))
    await traffic.drain("g")
    report = traffic.history.report()
    print(f"published and consumed in {time.monotonic() - started:.1f} s: {report}")
    assert report["acked"] == 2000, report
    assert report["lost"] == 0, report
    assert report["unexpected"] == 0, report

    run_id = network.id
    cluster.down()
    assert network.leftovers() == []
    assert f"ch{run_id}-" not in _netns_names()
    assert f"ch{run_id}" not in _ip("-o", "link")


async def _open_extents(url: str, queue: str) -> set[str]:
    async with AsyncClient(url) as client:
        body = await client.request("GET", f"/v1/queues/{queue}/extents")
    return {e["id"] for e in body["extents"] if e["status"] == "open" and e["kind"] == "plain"}


@pytest.mark.timeout(120)
async def test_store_host_cut_off_from_input_hosts_loses_nothing(
    netns_cluster: NetnsCluster,
) -> None:
    cluster, network = netns_cluster, netns_cluster.network
    async with AsyncClient(cluster.url) as client:
        await client.create_queue("cut")
        await client.create_group("cut", "g", visibility_timeout_seconds=10)
    traffic = Traffic(cluster.url, "cut")
    producers = [asyncio.create_task(traffic.publish(w, batch=20)) for w in range(2)]
    await asyncio.sleep(3)
    acked_before = len(traffic.history.acked)
    open_before = await _open_extents(cluster.url, "cut")
    store = network.hosts["storehost-0"].ip
    for name in cluster.names("inputhost"):
        network.cut("storehost-0", name)
    assert not await asyncio.to_thread(_reachable, network, "inputhost-0", store, HOST_PORT)
    assert await asyncio.to_thread(_reachable, network, "controller-0", store, HOST_PORT)
    await asyncio.sleep(8)
    acked_in_cut = len(traffic.history.acked) - acked_before
    network.heal()
    assert await asyncio.to_thread(_reachable, network, "inputhost-0", store, HOST_PORT)
    await asyncio.sleep(4)
    traffic.stop.set()
    await asyncio.gather(*producers)
    await traffic.drain("g")
    report = traffic.history.report()
    print(f"acked {acked_before} before the cut, {acked_in_cut} during it; {report}")
    assert acked_before > 0
    # the extents open before the cut lost a replica: they were sealed (or consumed and
    # deleted since), so the cut did bite
    assert not open_before & await _open_extents(cluster.url, "cut")
    assert report["acked"] > acked_before, report
    assert report["lost"] == 0, report
    assert report["unexpected"] == 0, report


def test_cli_cluster_up_netns_and_down_leave_nothing(tmp_path: Path) -> None:
    """``cherami cluster up --netns`` (SQLite metadata: the namespaces share the disk, not
    the network) and ``cluster down``, which removes the hosts from the saved state."""
    cli = [sys.executable, "-m", "cherami.cli.main", "cluster"]
    root = str(tmp_path / "cli")
    up = subprocess.run(
        [*cli, "up", "--dir", root, "--netns", "--zones", "a,b", "--cpu-quota", "0.5",
         "--controllers", "1", "--inputs", "1", "--outputs", "1", "--port", "8090"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    saved = tmp_path / "cli" / "cluster.json"
    assert saved.exists(), f"cluster up saved no state: {up.returncode}\n{up.stdout}{up.stderr}"
    state = json.loads(saved.read_text())
    run_id = state["netns"]["id"]
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "zone b" in up.stdout
        assert len({p["address"] for p in state["procs"].values()}) == 7
        assert state["url"].endswith(":8090")
        assert _ip("netns", "list").count(f"ch{run_id}-") == 7
    finally:
        down = subprocess.run([*cli, "down", "--dir", root], capture_output=True, text=True)
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers(run_id) == []
