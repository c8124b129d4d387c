"""Scale-out of one hot queue: publish msgs/s with 1, 2 and 4 input hosts, and
consume+ack msgs/s with 1, 2 and 4 output hosts, on hosts that are separate network
namespaces (cherami.devcluster.netns), each host of the role under test capped at a small
CPU quota (cgroup cfs quota, v1 or v2) so that it binds and the 2-core box does not.

    python benchmarks/scaleout.py --quick            # a few seconds per point
    python benchmarks/scaleout.py                    # the full run, saturating run too
    python benchmarks/scaleout.py --roles publish --hosts 1,2 --quick
    python benchmarks/scaleout.py --roles saturate   # the saturating run alone (~5 min)

The saturating run (``--roles saturate``, scaleout_saturate.py) is different: no host is
capped, and one queue scales by load from 1 to 4 extents under publishers as fast as they
go, then back (issue 33, part 1).

Needs root, iproute2, iptables and PostgreSQL (a private server on the bridge is the
metadata store). Each point gets a fresh cluster: store hosts, one controller, the input
(or output) hosts under test capped at ``--cpu`` each, the other role's hosts and one
frontend uncapped. Producers and consumers are processes in the root namespace (no cap).

* publish: the queue has ``min_extents`` = ``max_extents`` = N (one extent per input host,
  scaling off), and ``--producers-per-host`` producer processes per input host. Where
  the server has Cherami's routing call (``GET /v1/queues/{q}/publishers``) the producers
  use the public client through the frontend and it spreads them; otherwise each
  producer streams to one input host's own address (round robin).
* consume+ack: a backlog is published first (by uncapped input hosts), then drained
  by stream consumers through the frontend. Where the server assigns a group to output
  hosts per extent (``GET .../groups/{g}/consumers`` answers) one group is drained by N
  consumers; otherwise a group is held whole by one output host, and the load reaches
  N output hosts only as N groups of the same queue (one per host, each its own copy
  of the backlog): the rate is then the acks of all groups together, and says so.

A point's rate counts the acks inside a window of ``--seconds`` after ``--warmup``
seconds. CPU use over the window comes from /proc/<pid>/stat (role processes and their
children, the load-generating processes) and /proc/stat (the whole box); the capped
hosts' cgroup throttling shows whether the cap bound. Writes
``results/scaleout-<quick|full>-<timestamp>.json`` and ``.png`` (and ``scaleout-latest.*``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.netnspg import netns_cluster_on_pg  # noqa: E402

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.devcluster.netns import NetnsCluster  # noqa: E402
from cherami.errors import CheramiError  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
QUEUE = "hot"
TICKS = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- load workers
# Each runs in a process of its own (root namespace, uncapped), started by the parent,
# and prints one JSON line: acks counted inside [start, end] of CLOCK_MONOTONIC, which
# every process of the machine shares.


class Acks:
    """Acks per 0.1 s of CLOCK_MONOTONIC (shared by every process of the machine); prints
    "first" at the first, so the parent knows when every load process is going."""

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.first = self.last = 0.0

    def add(self, count: int) -> None:
        self.last = time.monotonic()
        if not self.first:
            self.first = self.last
            print("first", flush=True)
        key = int(self.last * 10)
        self.buckets[key] = self.buckets.get(key, 0) + count

    def result(self, **more: Any) -> dict[str, Any]:
        return {"buckets": self.buckets, "first": self.first, "last": self.last, **more}


def _stop_on_sigterm() -> asyncio.Event:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    return stop


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    """Publish batches (``in_flight`` at once) until SIGTERM, or ``total`` messages."""
    stop = _stop_on_sigterm()
    batch = [b"x" * args.size] * args.batch
    acks = Acks()
    errors = sent = 0
    pending: set[asyncio.Future[list[str]]] = set()

    def done(fut: asyncio.Future[list[str]]) -> None:
        nonlocal errors
        pending.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            errors += 1
        else:
            acks.add(len(batch))

    client = AsyncClient(args.url, timeout=30)
    async with client, client.publisher(args.queue, max_in_flight=args.in_flight) as pub:
        while not stop.is_set() and (not args.total or sent < args.total):
            while len(pending) >= args.in_flight:
                await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
            fut = await pub.send(batch)
            sent += len(batch)
            pending.add(fut)
            fut.add_done_callback(done)
        if pending:
            await asyncio.wait(set(pending), timeout=30)
    return acks.result(sent=sent, errors=errors)


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    """Consume and ack until SIGTERM."""
    stop = _stop_on_sigterm()
    acks = Acks()
    client = AsyncClient(args.url, timeout=30)
    async with client, client.consumer(args.queue, args.group, credit=args.credit) as consumer:
        while not stop.is_set():
            batch = await consumer.get_batch(1000, timeout=0.2)
            if batch:
                consumer.ack(*batch)
                acks.add(len(batch))
        await consumer.flush()
    return acks.result()


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["produce", "consume"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", default=QUEUE)
    parser.add_argument("--group", default="g0")
    parser.add_argument("--total", type=int, default=0)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--credit", type=int, default=4000)
    args = parser.parse_args(argv)
    import uvloop

    job = produce if args.kind == "produce" else consume
    print(json.dumps(uvloop.run(job(args))), flush=True)


# --------------------------------------------------------------------------- measuring


def proc_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (a store host's RocksDB child)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
    except psutil.Error:
        pass
    return total


def box_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def throttled(cgroup: str) -> tuple[int, int, float]:
    """(periods, throttled periods, throttled seconds) of a host's cgroup so far."""
    stat = dict(
        line.split() for line in (Path(cgroup) / "cpu.stat").read_text().splitlines() if line
    )
    if "throttled_usec" in stat:  # v2
        return int(stat["nr_periods"]), int(stat["nr_throttled"]), int(stat["throttled_usec"]) / 1e6
    return int(stat["nr_periods"]), int(stat["nr_throttled"]), int(stat["throttled_time"]) / 1e9


class Meter:
    """CPU of every role process, the load processes and the box over a window."""

    def __init__(self, cluster: NetnsCluster, capped: list[str]) -> None:
        self.cluster = cluster
        self.capped = capped
        self.loaders: list[int] = []

    def snap(self) -> dict[str, Any]:
        return {
            "t": time.monotonic(),
            "procs": {n: proc_cpu(p.pid) for n, p in self.cluster.procs.items()},
            "loaders": sum(proc_cpu(p) for p in self.loaders),
            "box": box_busy(),
            "cgroups": {n: throttled(self.cluster.network.hosts[n].cgroup) for n in self.capped},
        }

    def report(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        span = b["t"] - a["t"]
        cpu = {n: round((b["procs"][n] - a["procs"][n]) / span, 3) for n in a["procs"]}
        roles: dict[str, list[float]] = {}
        for name, used in cpu.items():
            if name not in self.capped:
                roles.setdefault(self.cluster.procs[name].role, []).append(used)
        busy = (b["box"][0] - a["box"][0]) / max(1, b["box"][1] - a["box"][1])
        throttling = {}
        for n in self.capped:
            periods = b["cgroups"][n][0] - a["cgroups"][n][0]
            hit = b["cgroups"][n][1] - a["cgroups"][n][1]
            throttling[n] = round(hit / periods, 3) if periods else 0.0
        return {
            "window_seconds": round(span, 2),
            "cpu_per_process": cpu,
            "capped_cpu": [cpu[n] for n in self.capped],
            "capped_throttled_fraction": throttling,
            "uncapped_cpu_by_role": {
                r: {"sum": round(sum(v), 3), "max": round(max(v), 3)}
                for r, v in sorted(roles.items())
            },  # fmt: skip
            "load_processes_cpu": round((b["loaders"] - a["loaders"]) / span, 3),
            "box_busy_cpus": round(busy * os.cpu_count(), 3) if os.cpu_count() else None,
        }


def spawn(kind: str, **opts: Any) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "_worker", kind]
    for key, value in opts.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def collect(workers: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    out = []
    for w in workers:
        try:
            stdout, _ = w.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            w.kill()
            stdout, _ = w.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if w.returncode != 0 or not lines:
            raise RuntimeError(f"a load process failed (exit {w.returncode})")
        out.append(json.loads(lines[-1]))
    return out


async def has_route(url: str, path: str) -> bool:
    """Whether the server answers a routing call (a 404 means it has no such route)."""
    async with AsyncClient(url) as client:
        try:
            await client.request("GET", path)
        except CheramiError:
            return False
    return True


async def output_hosts_serving(url: str, group: str, n: int) -> float:
    """Wait until the routing call lists ``n`` output hosts holding the group's extents
    (each takes its share at its next ownership tick); returns how long it took."""
    began = time.monotonic()
    async with AsyncClient(url) as client:
        while time.monotonic() < began + 60:
            route = await client.request("GET", f"/v1/queues/{QUEUE}/groups/{group}/consumers")
            if len(route["output_hosts"]) >= n:
                return time.monotonic() - began
            await asyncio.sleep(0.3)
    raise RuntimeError(f"the group was never spread over {n} output hosts")


async def input_addresses(url: str, n: int) -> list[str]:
    """The input hosts that hold the queue's open extents, once all ``n`` are open."""
    deadline = time.monotonic() + 30
    async with AsyncClient(url) as client:
        while time.monotonic() < deadline:
            view = await client.request("GET", f"/v1/queues/{QUEUE}/extents")
            hosts = sorted({e["input_host"] for e in view["extents"]
                            if e["status"] == "open" and e["kind"] == "plain"})  # fmt: skip
            if len(hosts) >= n:
                return hosts
            await asyncio.sleep(0.3)
    raise RuntimeError(f"the queue's extents never spread over {n} input hosts")


# --------------------------------------------------------------------------- the points


def _counts(role: str, n: int, stores: int) -> dict[str, int]:
    other = "outputhost" if role == "inputhost" else "inputhost"
    return {"storehost": stores, "controller": 1, role: n,
            other: 2 if role == "outputhost" else 1, "frontend": 1}  # fmt: skip


async def _make_queue(url: str, extents: int, replicas: int, groups: int) -> None:
    async with AsyncClient(url) as client:
        await client.create_queue(
            QUEUE, replicas=replicas, min_extents=extents, max_extents=extents,
            extent_target_rate=10_000_000,
        )  # fmt: skip
        for g in range(groups):
            await client.create_group(QUEUE, f"g{g}", visibility_timeout_seconds=60)


async def measure(
    workers: list[subprocess.Popen[str]], meter: Meter, opts: argparse.Namespace
) -> dict[str, Any]:
    """Wait until every load process has its first ack, then ``warmup`` seconds; count
    the acks of the next ``seconds`` (the window) and the CPU used in it; stop them."""
    meter.loaders = [w.pid for w in workers]
    began = time.monotonic()
    try:
        for w in workers:
            assert w.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(w.stdout.readline), 60)
            if line.strip() != "first":
                raise RuntimeError("a load process got no ack")
        going = time.monotonic() - began
        start = time.monotonic() + opts.warmup
        end = start + opts.seconds
        await asyncio.sleep(start - time.monotonic())
        a = meter.snap()
        await asyncio.sleep(end - time.monotonic())
        b = meter.snap()
    except BaseException:
        for w in workers:
            w.kill()
        raise
    for w in workers:
        w.send_signal(signal.SIGTERM)
    results = await asyncio.to_thread(collect, workers, 60)
    acked = sum(
        count for r in results for key, count in r["buckets"].items()
        if start * 10 <= int(key) < end * 10
    )  # fmt: skip
    return {
        "msgs_s": round(acked / opts.seconds, 1),
        "all_load_processes_acked_after_s": round(going, 2),
        "ran_dry": any(r["last"] < end - 0.5 for r in results),
        "errors": sum(r.get("errors", 0) for r in results),
        **meter.report(a, b),
    }


async def publish_point(cluster: NetnsCluster, n: int, opts: argparse.Namespace) -> dict[str, Any]:
    capped = cluster.names("inputhost")
    await _make_queue(cluster.url, n, opts.replicas, 0)
    hosts = await input_addresses(cluster.url, n)
    spread = await has_route(cluster.url, f"/v1/queues/{QUEUE}/publishers")
    urls = [cluster.url] if spread else [f"http://{h}" for h in hosts]
    workers = [
        spawn("produce", url=urls[i % len(urls)], size=opts.size, batch=opts.batch,
              in_flight=opts.in_flight)
        for i in range(n * opts.producers_per_host)
    ]  # fmt: skip
    measured = await measure(workers, Meter(cluster, capped), opts)
    return {
        "role": "inputhost", "hosts": n,
        "route": "routing call (client spreads)" if spread else "stream to each input host",
        "producers": len(workers), **measured,
    }  # fmt: skip


async def consume_point(cluster: NetnsCluster, n: int, opts: argparse.Namespace) -> dict[str, Any]:
    capped = cluster.names("outputhost")
    await _make_queue(cluster.url, max(2, n), opts.replicas, 1)
    spread = await has_route(cluster.url, f"/v1/queues/{QUEUE}/groups/g0/consumers")
    groups = 1 if spread else n
    async with AsyncClient(cluster.url) as client:
        for g in range(1, groups):
            await client.create_group(QUEUE, f"g{g}", visibility_timeout_seconds=60)
    # enough for the whole window at the expected rate, with a margin; in the fallback
    # every group reads the same messages, so the backlog is per group
    backlog = opts.backlog or int(opts.expect * (3 + opts.warmup + opts.seconds) * 1.3)
    backlog *= n if spread else 1
    hosts = await input_addresses(cluster.url, 2)
    per = -(-backlog // (2 * opts.producers_per_host * opts.batch)) * opts.batch
    fill = [
        spawn("produce", url=f"http://{hosts[i % 2]}", total=per, size=opts.size,
              batch=opts.batch, in_flight=opts.in_flight)
        for i in range(2 * opts.producers_per_host)
    ]  # fmt: skip
    filled_at = time.monotonic()
    filled = await asyncio.to_thread(collect, fill, 600)
    fill_s = time.monotonic() - filled_at
    spread_after = await output_hosts_serving(cluster.url, "g0", n) if spread else None
    consumers = n * opts.consumers_per_host
    workers = [
        spawn("consume", url=cluster.url, group=f"g{i % groups}", credit=opts.credit)
        for i in range(consumers)
    ]  # fmt: skip
    measured = await measure(workers, Meter(cluster, capped), opts)
    return {
        "role": "outputhost", "hosts": n,
        "route": "one group, spread per extent" if spread else f"{groups} group(s), one per "
                 "output host (a group is held whole by one output host)",
        "groups": groups, "consumers": consumers, "group_on_all_hosts_after_s": spread_after,
        "backlog_per_group": sum(r["sent"] for r in filled),
        "backlog_publish_msgs_s": round(sum(r["sent"] for r in filled) / fill_s, 1),
        **measured,
    }  # fmt: skip


async def run_point(role: str, n: int, opts: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    counts = _counts(role, n, opts.stores or max(2, opts.replicas))
    quota = {f"{role}-{i}": opts.cpu for i in range(n)}
    with netns_cluster_on_pg(tmp / f"{role}-{n}", counts, cpu_quota=quota) as cluster:
        point = publish_point if role == "inputhost" else consume_point
        result = await point(cluster, n, opts)
        result["counts"] = counts
        return result


# --------------------------------------------------------------------------- reporting


def table(points: list[dict[str, Any]]) -> str:
    head = ("role", "hosts", "msgs/s", "speed-up", "capped CPU each", "throttled",
            "uncapped roles: CPU sum (max one process)", "load procs", "box busy")  # fmt: skip
    rows = [head]
    base: dict[str, float] = {}
    for p in points:
        base.setdefault(p["role"], p["msgs_s"])
        speed = p["msgs_s"] / base[p["role"]] if base[p["role"]] else 0.0
        p["speed_up"] = round(speed, 2)
        uncapped = ", ".join(f"{r} {v['sum']:.2f} ({v['max']:.2f})"
                             for r, v in p["uncapped_cpu_by_role"].items())  # fmt: skip
        throttled_ = max(p["capped_throttled_fraction"].values(), default=0.0)
        rows.append((
            "publish" if p["role"] == "inputhost" else "consume+ack", str(p["hosts"]),
            f"{p['msgs_s']:,.0f}", f"{speed:.2f}x",
            " ".join(f"{c:.2f}" for c in p["capped_cpu"]), f"{throttled_:.0%}",
            uncapped, f"{p['load_processes_cpu']:.2f}", f"{p['box_busy_cpus']:.2f}/2",
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def plot(points: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, role, label in ((axes[0], "inputhost", "publish"),
                            (axes[1], "outputhost", "consume+ack")):  # fmt: skip
        mine = [p for p in points if p["role"] == role]
        if not mine:
            ax.set_visible(False)
            continue
        xs = [p["hosts"] for p in mine]
        ys = [p["msgs_s"] for p in mine]
        ax.plot(xs, ys, "o-", label="measured")
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], "--", color="grey", label="linear")
        for x, y, p in zip(xs, ys, mine, strict=True):
            ax.annotate(f"{p['speed_up']:.2f}x", (x, y), textcoords="offset points",
                        xytext=(5, -12))  # fmt: skip
        ax.set_xticks(xs)
        ax.set_xlabel(f"{role}s (each capped)")
        ax.set_ylabel("msgs/s")
        ax.set_title(f"{label}\n{mine[0]['route']}", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    if sys.argv[1:2] == ["_worker"]:
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds per point")
    parser.add_argument(
        "--roles", help="publish,consume,saturate (default; --quick: publish,consume)"
    )
    parser.add_argument("--hosts", default="1,2,4")
    parser.add_argument("--cpu", type=float, default=0.1, help="CPUs per capped host")
    parser.add_argument("--seconds", type=float, help="measured window (quick 3, full 12)")
    parser.add_argument("--warmup", type=float, help="seconds before it (quick 1, full 2)")
    parser.add_argument(
        "--backlog",
        type=int,
        help="messages per group (default: --expect x (3 s + warm-up + window) x 1.3)",
    )
    parser.add_argument(
        "--expect",
        type=float,
        default=30_000,
        help="consume+ack msgs/s one capped output host is expected to reach",
    )
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--stores", type=int, help="store hosts (default: max(2, replicas))")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--credit", type=int, default=4000)
    parser.add_argument("--producers-per-host", type=int, default=1)
    parser.add_argument("--consumers-per-host", type=int, default=1)
    parser.add_argument(
        "--saturate-producers",
        type=int,
        default=2,
        help="saturate: streaming publishers, as fast as they go",
    )
    parser.add_argument(
        "--saturate-seconds", type=float, default=60.0, help="saturate: seconds of publishing"
    )
    parser.add_argument(
        "--shrink-seconds",
        type=float,
        default=300.0,
        help="saturate: seconds to watch the shrink (ends at 1 extent)",
    )
    parser.add_argument(
        "--extent-messages",
        type=int,
        help="saturate: the cluster's --extent-max-messages (1,000,000)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    opts = parser.parse_args()
    opts.seconds = opts.seconds or (3.0 if opts.quick else 12.0)
    opts.warmup = opts.warmup if opts.warmup is not None else (1.0 if opts.quick else 2.0)
    opts.roles = opts.roles or ("publish,consume" if opts.quick else "publish,consume,saturate")
    roles = {"publish": "inputhost", "consume": "outputhost"}
    wanted = [roles[r] for r in opts.roles.split(",") if r in roles]
    saturated: list[dict[str, Any]] = []
    counts = [int(h) for h in opts.hosts.split(",")]
    started = time.strftime("%Y%m%d-%H%M%S")
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cherami-scaleout-") as tmp:
        for role in wanted:
            for n in counts:
                t0 = time.monotonic()
                point = asyncio.run(run_point(role, n, opts, Path(tmp)))
                point["seconds_taken"] = round(time.monotonic() - t0, 1)
                points.append(point)
                print(f"{role} x{n}: {point['msgs_s']:,.0f} msgs/s ({point['route']})",
                      flush=True)  # fmt: skip
        if "saturate" in opts.roles.split(","):
            from scaleout_saturate import saturate, summary

            t0 = time.monotonic()
            point = asyncio.run(saturate(opts, Path(tmp), spawn, collect))
            point["seconds_taken"] = round(time.monotonic() - t0, 1)
            saturated.append(point)
            print(summary(point), flush=True)
    opts.out.mkdir(parents=True, exist_ok=True)
    mode = "quick" if opts.quick else "full"
    doc = {
        "started": started, "mode": mode, "host": platform.node(), "cpus": os.cpu_count(),
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "points": points,
    }  # fmt: skip
    if points:
        print(table(points))
        title = (f"one hot queue, hosts under test capped at {opts.cpu} CPU each, "
                 f"{opts.size} B, replicas {opts.replicas}, {mode} mode ({opts.seconds:.0f} s "
                 f"windows), 2-core box shared with other work, {started}")  # fmt: skip
        for name in (f"scaleout-{mode}-{started}", "scaleout-latest"):
            (opts.out / f"{name}.json").write_text(json.dumps(doc, indent=2))
            plot(points, opts.out / f"{name}.png", title)
        print(f"wrote {opts.out}/scaleout-{mode}-{started}.json and .png")
    for point in saturated:
        from scaleout_saturate import plot_saturate

        doc["points"] = [point]
        for name in (f"scaleout-saturate-{started}", "scaleout-saturate-latest"):
            (opts.out / f"{name}.json").write_text(json.dumps(doc, indent=2))
            plot_saturate(point, opts.out / f"{name}.png", started)
        print(f"wrote {opts.out}/scaleout-saturate-{started}.json and .png")
    if saturated and not all(p["passed"] for p in saturated):
        sys.exit(1)


if __name__ == "__main__":
    main()
