"""The saturating run of benchmarks/scaleout.py (``--roles saturate``, issue 33 part 1):
one queue with ``extent_target_rate`` 2000 and ``min_extents`` 1 / ``max_extents`` 4 on
a cluster of 4 input hosts, none capped, published as fast as ``--saturate-producers``
streaming publishers go for ``--saturate-seconds`` (60), then left idle for up to
``--shrink-seconds`` (300) or until it is back to one extent. The controller keeps its
default windows (up 10 s, down 60 s, load reports every 2 s) and extents their default
size (1,000,000 messages), so at full speed they roll over while it runs.

Every second it records, from the metadata store (what the leading controller reads):

* the queue's open plain extents and the input hosts holding them;
* the queue's rate as the controller sums it (scaling.queue_rates: the plain extents in
  the live input hosts' latest load reports, sealed ones included);
* how old each input host's load report is, and when the leader last renewed its lease
  (its tick renews it every 0.5 s: a starved tick shows as an old renewal);
* the 1-minute load average of the machine;

and afterwards the controller's decisions from its log (``carries ... opened``,
``sealing``, ``rolls over``) and the producers' acks per second. The run passes when
at least 3 extents were open at once on at least 3 input hosts while publishing, and
the count went down after the publishing stopped."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from tests.support.netnspg import netns_cluster_on_pg

from cherami import timing
from cherami.client.asyncclient import AsyncClient
from cherami.devcluster.netns import NetnsCluster
from cherami.metadata.open import parse_metadata_url
from cherami.roles.controller.leader import LEASE

QUEUE = "hot"
TARGET, MAX_EXTENTS, INPUTS = 2000, 4, 4
DECISION = re.compile(
    r"carries|rolls over|sealed at|replaced|leads|follows|stops acting|failed|WARNING|ERROR"
)


def sample(conn: psycopg.Connection[Any], since: float) -> dict[str, Any]:
    """One look at the metadata store, as the leader sees it."""
    now = time.time()
    hosts = conn.execute(
        "SELECT id, address, heartbeat_at, load FROM hosts WHERE role = 'inputhost'"
    ).fetchall()
    extents = conn.execute(
        "SELECT id, status, input_host FROM extents WHERE queue = %s AND kind = 'plain'",
        (QUEUE,),
    ).fetchall()
    lease = conn.execute("SELECT expires_at FROM leases WHERE name = %s", (LEASE,)).fetchone()
    mine = {e[0] for e in extents}
    address = {h[0]: h[1] for h in hosts}
    alive = [h for h in hosts if now - h[2] <= timing.DEFAULT.dead_after]
    rate = sum(
        float(load.get("msgs_in", 0.0))
        for h in alive if h[3]
        for e, load in (h[3].get("extents") or {}).items() if e in mine
    )  # fmt: skip
    opened = sorted((e[0], address.get(e[2], e[2])) for e in extents if e[1] == "open")
    return {
        "t": round(time.monotonic() - since, 2),
        "load1": os.getloadavg()[0],
        "extents": len(opened),
        "input_hosts": sorted({h for _, h in opened}),
        "open": opened,
        "rate": round(rate, 1),
        "report_age_s": {h[1]: round(now - h[3]["at"], 2) for h in hosts if h[3]},
        "heartbeat_age_s": {h[1]: round(now - h[2], 2) for h in hosts},
        # the leader's lease runs LEASE_TTL from its last renewal
        "lease_renewed_age_s": round(now - (lease[0] - timing.DEFAULT.lease_ttl), 2)
        if lease else None,
    }  # fmt: skip


async def watch(
    conn: psycopg.Connection[Any], since: float, until: Callable[[dict[str, Any]], bool],
    seconds: float, out: list[dict[str, Any]], every: float = 1.0,
) -> None:  # fmt: skip
    """Sample every ``every`` s for ``seconds`` or until ``until(sample)``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s = await asyncio.to_thread(sample, conn, since)
        out.append(s)
        print(f"  t={s['t']:6.1f}s load {s['load1']:5.2f}  {s['extents']} extents on "
              f"{len(s['input_hosts'])} input hosts  rate {s['rate']:>9,.0f}  "
              f"lease renewed {s['lease_renewed_age_s']} s ago", flush=True)  # fmt: skip
        if until(s):
            return
        await asyncio.sleep(every)


def decisions(cluster: NetnsCluster, since_wall: float) -> list[str]:
    """The controllers' log lines about scaling, roll-over and leadership."""
    lines = []
    for name in cluster.names("controller"):
        proc = cluster.procs[name]
        text = proc.log.read_text(errors="replace")[proc.log_offset :]
        lines += [f"{name}: {line}" for line in text.splitlines() if DECISION.search(line)]
    return lines


def ack_rates(results: list[dict[str, Any]], since: float) -> list[tuple[int, int]]:
    """(second since the start, msgs acked in it) over every producer."""
    per: dict[int, int] = {}
    for r in results:
        for key, count in r["buckets"].items():
            second = int(int(key) / 10 - since)
            per[second] = per.get(second, 0) + count
    return sorted(per.items())


async def saturate(
    opts: argparse.Namespace, tmp: Path, spawn: Callable[..., subprocess.Popen[str]],
    collect: Callable[[list[subprocess.Popen[str]], float], list[dict[str, Any]]],
) -> dict[str, Any]:  # fmt: skip
    stores = opts.stores or max(2, opts.replicas)
    counts = {"storehost": stores, "controller": 1, "inputhost": INPUTS, "outputhost": 1,
              "frontend": 1}  # fmt: skip
    extra = ["--extent-max-messages", str(opts.extent_messages)] if opts.extent_messages else []
    with netns_cluster_on_pg(tmp / "saturate", counts, extra_args=extra) as cluster:
        async with AsyncClient(cluster.url) as client:
            await client.create_queue(
                QUEUE, replicas=opts.replicas, min_extents=1, max_extents=MAX_EXTENTS,
                extent_target_rate=TARGET,
            )  # fmt: skip
        target = parse_metadata_url(cluster.metadata)
        conn = psycopg.connect(target.location, autocommit=True)
        conn.execute(f"SET search_path TO {target.schema}")
        wall0, since = time.time(), time.monotonic()
        workers = [
            spawn("produce", url=cluster.url, size=opts.size, batch=opts.batch,
                  in_flight=opts.in_flight)
            for _ in range(opts.saturate_producers)
        ]  # fmt: skip
        samples: list[dict[str, Any]] = []
        try:
            await watch(conn, since, lambda s: False, opts.saturate_seconds, samples)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
        results = await asyncio.to_thread(collect, workers, 60)
        stopped = round(time.monotonic() - since, 2)
        print(f"  publishing stopped at t={stopped}s", flush=True)
        await watch(conn, since, lambda s: s["extents"] <= 1, opts.shrink_seconds, samples)
        conn.close()
        log = decisions(cluster, wall0)
    during = [s for s in samples if s["t"] <= stopped]
    after = [s for s in samples if s["t"] > stopped]
    peak = max(during, key=lambda s: (s["extents"], len(s["input_hosts"])))
    most_hosts = max(len(s["input_hosts"]) for s in during)
    first3 = next((s["t"] for s in during if s["extents"] >= 3), None)
    # the first shrink that lasts (a roll-over dips for a moment: sealed, successor next)
    first_down = next(
        (s["t"] for i, s in enumerate(after)
         if all(later["extents"] < peak["extents"] for later in after[i:])),
        None,
    )  # fmt: skip
    acked = sum(r["sent"] for r in results) if results else 0
    acks = ack_rates(results, since)
    grew = peak["extents"] >= 3 and len(peak["input_hosts"]) >= 3
    shrank = bool(after) and after[-1]["extents"] < max(s["extents"] for s in during)
    loads = [s["load1"] for s in samples]
    return {
        "role": "saturate", "counts": counts, "queue": {
            "extent_target_rate": TARGET, "min_extents": 1, "max_extents": MAX_EXTENTS,
            "replicas": opts.replicas},
        "producers": opts.saturate_producers, "publish_seconds": stopped,
        "extent_max_messages": opts.extent_messages or 1_000_000,
        "acked": acked, "errors": sum(r.get("errors", 0) for r in results),
        "msgs_s": round(acked / stopped, 1) if stopped else 0.0,
        "acks_per_second": acks,
        "peak_extents": peak["extents"], "peak_input_hosts": len(peak["input_hosts"]),
        "most_input_hosts": most_hosts,
        "three_extents_at_s": first3, "first_shrink_at_s": first_down,
        "shrink_seconds_after_stop": round(first_down - stopped, 1) if first_down else None,
        "extents_at_end": samples[-1]["extents"], "end_t": samples[-1]["t"],
        "load1_min": min(loads), "load1_max": max(loads),
        "max_report_age_s": max(
            (a for s in during for a in s["report_age_s"].values()), default=None),
        "max_lease_renewed_age_s": max(
            (s["lease_renewed_age_s"] or 0 for s in during), default=None),
        "grew": grew, "shrank": shrank, "passed": grew and shrank,
        "decisions": log, "samples": samples,
    }  # fmt: skip


def summary(p: dict[str, Any]) -> str:
    return (
        f"saturate: {p['msgs_s']:,.0f} msgs/s acked over {p['publish_seconds']:.0f} s by "
        f"{p['producers']} producers ({p['errors']} errors); peak {p['peak_extents']} extents "
        f"on {p['peak_input_hosts']} input hosts (3 at t={p['three_extents_at_s']}s); first "
        f"shrink {p['shrink_seconds_after_stop']} s after the stop, {p['extents_at_end']} "
        f"at t={p['end_t']}s; load {p['load1_min']:.1f}-{p['load1_max']:.1f}; oldest load "
        f"report {p['max_report_age_s']} s, lease renewal {p['max_lease_renewed_age_s']} s; "
        f"{'PASSED' if p['passed'] else 'FAILED'}"
    )


def plot_saturate(p: dict[str, Any], path: Path, started: str) -> None:
    """Extents and input hosts over time, with the controller's rate and the acks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.2))
    ts = [s["t"] for s in p["samples"]]
    ax.step(ts, [s["extents"] for s in p["samples"]], where="post", label="open extents")
    ax.step(ts, [len(s["input_hosts"]) for s in p["samples"]], where="post", linestyle="--",
            label="input hosts holding them")  # fmt: skip
    ax.axvline(p["publish_seconds"], color="grey", linestyle=":", label="publishing stops")
    ax.set_xlabel("seconds")
    ax.set_ylabel("extents")
    ax.set_ylim(0, MAX_EXTENTS + 0.5)
    rate = ax.twinx()
    rate.plot(ts, [s["rate"] for s in p["samples"]], color="tab:red", alpha=0.6,
              label="queue rate (controller's sum)")  # fmt: skip
    acks = p["acks_per_second"]
    rate.plot([a for a, _ in acks], [n for _, n in acks], color="tab:green", alpha=0.5,
              label="acked msgs/s")  # fmt: skip
    rate.set_ylabel("msgs/s")
    rate.set_ylim(bottom=0)
    fig.legend(loc="center right", bbox_to_anchor=(0.9, 0.6), fontsize=8)
    ax.set_title(
        f"saturating publish, target {TARGET}/extent, max {MAX_EXTENTS}, {INPUTS} input "
        f"hosts, load {p['load1_min']:.1f}-{p['load1_max']:.1f} on 2 cores, {started}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
