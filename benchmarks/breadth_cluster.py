"""``breadth.py --cluster``: how a cluster's costs grow with the number of queues. A
cluster on PostgreSQL (3 input, 3 output and 3 store hosts, 2 controllers, a frontend,
in a schema of its own) gets N queues of G groups each (one message in each); then
its idle CPU (every process, over --idle seconds after --settle; and by role, the
least and most of the role's processes), its resident set,
the metadata calls a second of its HTTP processes (store hosts have no /metrics
here), the rows read from and written to the lease tables a second (``leases`` and
``host_leases``, PostgreSQL's table statistics: what the output hosts' ownership ticks
read and renew), and the publish -> receive -> ack round
trip on one more queue; the same round trip on an empty cluster first, in the same run.

    .venv/bin/python benchmarks/breadth.py --cluster 1000 2000
    .venv/bin/python benchmarks/breadth.py --cluster --idle 30 --settle 30 500

Prints one row per N; nothing is estimated."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from breadth import _CALLS, _cpu_seconds, _create, _latency, _rss_mb
from cherami.devcluster.local import LocalCluster

COUNTS = {"storehost": 3, "controller": 2, "inputhost": 3, "outputhost": 3, "frontend": 1}
HTTP_ROLES = ("controller", "inputhost", "outputhost", "frontend")


def _metadata_calls(local: LocalCluster) -> float:
    """The metadata calls of every HTTP process so far (their /metrics), in all."""
    import urllib.request  # noqa: PLC0415

    total = 0.0
    for proc in local.procs.values():
        if proc.role not in HTTP_ROLES:
            continue
        with urllib.request.urlopen(f"http://{proc.address}/metrics", timeout=60) as resp:
            for line in resp.read().decode().splitlines():
                match = _CALLS.match(line)
                if match:
                    total += float(match.group(2))
    return total


def _connect(pg: str) -> psycopg.Connection[Any]:
    """A connection, waiting for one while the server has none to spare (other tests)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return psycopg.connect(pg, autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _lease_rows(pg: str, schema: str) -> tuple[float, float]:
    """Rows read from the schema's lease tables so far (sequential and by index), and
    rows written (inserted, updated, deleted)."""
    with _connect(pg) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), "
            "sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname IN ('leases', 'host_leases')",
            (schema,),
        ).fetchone()
    return (float(row[0] or 0), float(row[1] or 0)) if row else (0.0, 0.0)


class _Cluster:
    def __init__(self, pg: str, root: Path) -> None:
        self.pg = pg
        self.schema = f"b_{uuid.uuid4().hex[:12]}"
        self.local = LocalCluster(root, f"{pg}?schema={self.schema}", COUNTS)

    def __enter__(self) -> LocalCluster:
        self.local.up(timeout=300)
        return self.local

    def __exit__(self, *exc: object) -> None:
        self.local.down()
        with _connect(self.pg) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


def run(queues: int, groups: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = _Cluster(args.postgres, Path(tmp) / "cluster")
        with cluster as local:
            procs = {name: str(p.pid) for name, p in local.procs.items()}
            pids = list(procs.values())
            each = {name: _cpu_seconds([pid]) for name, pid in procs.items()}
            created = asyncio.run(_create(local.url, queues, groups, args.concurrency))
            # the CPU each role spent a queue made (ms), in all over its processes
            making = {n: (_cpu_seconds([p]) - each[n]) * 1000 / queues for n, p in procs.items()}
            time.sleep(args.settle)  # what creating left behind settles
            load = os.getloadavg()[0]
            # the scrapes that read the call counters cost each HTTP process CPU that
            # grows with the queues (a /metrics of 3,000 queues): the CPU window starts
            # after the first and ends before the last (it held both until 2026-11-29)
            calls = _metadata_calls(local)
            started = time.monotonic()
            leases = _lease_rows(args.postgres, cluster.schema)
            each = {name: _cpu_seconds([pid]) for name, pid in procs.items()}
            time.sleep(args.idle)
            each = {n: (_cpu_seconds([p]) - each[n]) / args.idle * 100 for n, p in procs.items()}
            cpu = sum(each.values())
            read, written = _lease_rows(args.postgres, cluster.schema)
            took = time.monotonic() - started
            reads, writes = (read - leases[0]) / took, (written - leases[1]) / took
            calls = (_metadata_calls(local) - calls) / (time.monotonic() - started)
            rss = _rss_mb(pids)
            p50, p99 = asyncio.run(_latency(local.url))
    return {
        "create_s": created, "idle_cpu_pct": cpu, "rss_mb": rss, "metadata_per_s": calls,
        "by_role": _by_role(each), "making": _role_sums(making), "load": (load, os.getloadavg()[0]),
        "lease_reads_per_s": reads,
        "lease_writes_per_s": writes, "p50": p50, "p99": p99,
    }  # fmt: skip


def _roles(each: dict[str, float]) -> dict[str, list[float]]:
    """A figure of each process, by role (a process is named role-N)."""
    roles: dict[str, list[float]] = {}
    for name, value in each.items():
        roles.setdefault(name.rsplit("-", 1)[0], []).append(value)
    return roles


def _by_role(each: dict[str, float]) -> str:
    """The idle CPU of each role's processes (% of a core), the least and the most."""
    return ", ".join(f"{role} {min(v):.1f}-{max(v):.1f}" for role, v in _roles(each).items())


def _role_sums(each: dict[str, float]) -> str:
    """A figure summed over each role's processes."""
    return ", ".join(f"{role} {sum(v):.1f}" for role, v in _roles(each).items())


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp, _Cluster(args.postgres, Path(tmp) / "c") as local:
        p50, p99 = asyncio.run(_latency(local.url))
    print(f"empty cluster: publish to receive p50 / p99 {p50:.1f} / {p99:.1f} ms", flush=True)
    print("| queues x groups | create all (s) | queues/s | idle CPU (% of a core, all "
          "processes) | RSS (MB, all) | metadata calls/s idle (HTTP processes) "
          "| lease rows read/s idle | lease rows written/s idle "
          "| publish to receive p50 / p99 (ms) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.queues:
        r = run(n, args.groups, args)
        print(
            f"| {n} x {args.groups} | {r['create_s']:.1f} | {n / r['create_s']:.0f} "
            f"| {r['idle_cpu_pct']:.1f} | {r['rss_mb']:.0f} | {r['metadata_per_s']:.1f} "
            f"| {r['lease_reads_per_s']:.0f} | {r['lease_writes_per_s']:.0f} "
            f"| {r['p50']:.1f} / {r['p99']:.1f} |",
            flush=True,
        )
        print(f"  idle CPU by role (% of a core; load average {r['load'][0]:.1f} -> "
              f"{r['load'][1]:.1f}): {r['by_role']}", flush=True)  # fmt: skip
        print(f"  CPU to create, ms a queue, each role's processes together: {r['making']}",
              flush=True)  # fmt: skip
