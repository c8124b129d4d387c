"""How long a cluster with many queues takes to serve again after its controllers and its
store hosts are restarted (issue 34: "the same for a cluster's controller and store
hosts with many extents", <= 30 s, every message published before delivered after).

A cluster of role processes on loopback (3 store hosts, 2 controllers, an input host, an
output host, a frontend; PostgreSQL metadata on 127.0.0.1:5432 (``--pg``), database ``test``, in a
schema of its own, dropped at the end) with N queues of G groups and one message in each
queue; then, one after another:

- ``controllers``: both controllers SIGKILLed and restarted together;
- ``stores``: every store host SIGKILLed, down until the cluster counts them dead and
  the leader has tried to seal their extents (a power loss), then restarted together;
- ``none``: nothing restarted: how long the check itself takes on this machine now.

After each, the time until the cluster serves again: every queue takes a publish and
every group has received (and acked) what was published before and that publish. It
prints that time, how many deliveries came within ``--within`` seconds (the bound), how
many within ``--after`` seconds more (late), and how many never (lost), which groups
missed one at the bound, and the phases from the processes' logs: the store
hosts listening, the leader's "replaced the extents of lost hosts" line, and the last
unit the output host took; and each process's CPU seconds and each HTTP process's
metadata calls (its /metrics, by operation) over the round.

    .venv/bin/python benchmarks/cluster_restart.py --queues 1000
    .venv/bin/python benchmarks/cluster_restart.py --queues 100 --rounds stores

Nothing is estimated; one run per invocation."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cherami import timing  # noqa: E402
from cherami.bounded import each  # noqa: E402
from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.devcluster.local import LocalCluster  # noqa: E402
from cherami.errors import Unavailable  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432/test"
COUNTS = {"storehost": 3, "controller": 2, "inputhost": 1, "outputhost": 1, "frontend": 1}
AT_ONCE = 24  # requests under way at once
# receives under way at once (long polls, mostly waiting; the client keeps 100
# connections): 24 receives of a second each took 83 s for a pass over 2,000 groups
# with nothing to deliver yet, so the check could not see a cluster served sooner
RECEIVES_AT_ONCE = 96
RECEIVE_WAIT = 0.5
LAST_WAIT = 2.0  # the wait of the last receive of a group still missing a message
REPLACED = re.compile(r"replaced the extents of lost hosts: .*")
STAMP = re.compile(r"^\S+ (\d\d:\d\d:\d\d,\d+) ")
CALLS = re.compile(r'^cherami_metadata_call_latency_seconds_count\{op="([^"]+)"\} (\S+)$', re.M)


def _live_stores(pg: str, schema: str) -> int:
    with psycopg.connect(pg, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {schema}.hosts WHERE role = 'storehost' AND heartbeat_at >= %s",
            (time.time() - timing.DEFAULT.dead_after,),
        ).fetchone()
    return int(row[0]) if row else 0


async def _each(n: int, one, at_once: int = AT_ONCE) -> None:  # type: ignore[no-untyped-def]
    """``one(i)`` for i in range(n), ``at_once`` at a time."""
    await each(range(n), one, at_once)


async def _publish(client: AsyncClient, queue: str, body: str, deadline: float) -> None:
    """Publish, sent again while refused (503: extents being replaced) until ``deadline``."""
    await client.publish(queue, [body], retry_seconds=max(1.0, deadline - time.monotonic()))


async def _served(
    client: AsyncClient,
    queues: int,
    groups: int,
    tags: tuple[str, str],
    deadline: float,
    late: float,
) -> tuple[int, int, int, list[str], list[float], list[float]]:
    """Publish ``tags[1]`` to every queue, then receive and ack in every group until it
    and ``tags[0]`` are there (or ``late`` seconds past the deadline), in passes over the
    groups still waiting (one receive each a pass: a group that delivers nothing does not
    hold back the others' checks): (delivered by the deadline, delivered late, not
    delivered at all, the groups missing one at the deadline, when each was seen, and for
    each the end of the group's last receive before that left it wanted)."""
    started = time.monotonic()
    end = deadline + late

    async def publish(i: int) -> None:  # until the end: one refused past the bound
        await _publish(client, f"q{i}", f"{tags[1]}-{i}", end)  # is late, not a crash

    await _each(queues, publish)
    print(f"  every queue took a publish {time.monotonic() - started:.1f} s from the check's "
          "start; the receives start", flush=True)  # fmt: skip
    want = {(i, g): {f"{t}-{i}" for t in tags} for i in range(queues) for g in range(groups)}
    seen: list[float] = []
    # when the group's last receive that left something wanted ended: a message seen
    # later was not there before then (the check sees a group once a pass, so it sees a
    # delivery up to a pass late: about waiting groups / RECEIVES_AT_ONCE x RECEIVE_WAIT)
    empty: dict[tuple[int, int], float] = {}
    ready: list[float] = []  # for each delivery, that time (the earliest it can have come)

    async def one(key: tuple[int, int], wait: float = RECEIVE_WAIT, last: bool = False) -> None:
        i, g = key
        if time.monotonic() >= end and not last:
            return
        try:
            batch = await client.receive(f"q{i}", f"g{g}", max_messages=10, wait_seconds=wait)
            if batch:
                await client.ack(f"q{i}", f"g{g}", [m.receipt or "" for m in batch])
        except Unavailable:
            empty[key] = time.monotonic() - started
            await asyncio.sleep(0.2)
            return
        now = time.monotonic() - started
        wanted = [m for m in batch if m.text in want[key]]
        for m in wanted:
            want[key].discard(m.text)
            seen.append(now)
            ready.append(empty.get(key, 0.0))
        if want[key]:  # what is still wanted was not there by now
            empty[key] = now

    missed: list[str] = []
    while time.monotonic() < end:
        waiting = [key for key, left in want.items() if left]
        if not waiting:
            break
        if not missed and time.monotonic() >= deadline:
            missed = sorted(f"q{i}/g{g}" for i, g in waiting)
        await each(waiting, one, RECEIVES_AT_ONCE)
    if not missed and time.monotonic() >= deadline:
        missed = sorted(f"q{i}/g{g}" for (i, g), left in want.items() if left)
    # every group still missing something is asked once more: on a loaded machine a
    # pass over 2,000 groups outlasted the window, and the groups at the end of the
    # list, never asked, were counted lost with their messages ready on the output host
    waiting = [key for key, left in want.items() if left]
    if waiting:
        before = sum(len(left) for left in want.values())
        await each(waiting, lambda key: one(key, LAST_WAIT, last=True), RECEIVES_AT_ONCE)
        print(
            f"  asked once more after the window: {len(waiting)} groups, "
            f"{before - sum(len(left) for left in want.values())} messages came",
            flush=True,
        )
    lost = sum(len(left) for left in want.values())
    if lost:  # by group: which tag of which queue never came
        never = sorted(
            f"q{i}/g{g}:{','.join(sorted(left))}" for (i, g), left in want.items() if left
        )
        print(f"  never delivered: {' '.join(never[:40])}" + (" ..." if len(never) > 40 else ""))
    by_deadline = sum(t <= deadline - started for t in seen)
    return by_deadline, len(seen) - by_deadline, lost, missed, sorted(seen), sorted(ready)


def _lines(local: LocalCluster, role: str, since: dict[str, int]) -> list[str]:
    out = []
    for name in local.names(role):
        with open(local.procs[name].log, "rb") as log:
            log.seek(since.get(name, 0))
            out += log.read().decode(errors="replace").splitlines()
    return out


def _cpu(local: LocalCluster) -> dict[str, float]:
    """CPU seconds (user + system) each process of the cluster has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, proc in local.procs.items():
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / tick
    return used


def _calls(local: LocalCluster) -> dict[str, dict[str, float]]:
    """Each HTTP process's metadata calls so far, by operation (its /metrics)."""
    import urllib.request  # noqa: PLC0415

    out: dict[str, dict[str, float]] = {}
    for name, proc in local.procs.items():
        if proc.role == "storehost":
            continue  # no /metrics on its port
        try:
            with urllib.request.urlopen(f"http://{proc.address}/metrics", timeout=60) as resp:
                out[name] = {op: float(n) for op, n in CALLS.findall(resp.read().decode())}
        except OSError:
            continue
    return out


def _calls_line(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> str:
    """The metadata calls each process made between two scrapes: all, and its top six
    (an output host's every one)."""
    parts = []
    for name in sorted(after):
        made = {op: n - before.get(name, {}).get(op, 0.0) for op, n in after[name].items()}
        top = sorted(made.items(), key=lambda kv: -kv[1])
        top = top if name.startswith("outputhost") else top[:6]  # (the refresh's calls too)
        parts.append(f"{name} {sum(made.values()):.0f} ("
                     + ", ".join(f"{op} {n:.0f}" for op, n in top) + ")")  # fmt: skip
    return "  metadata calls in the round: " + "; ".join(parts)


def _last(lines: list[str], pattern: str) -> str:
    """The time of the last line matching ``pattern`` (HH:MM:SS,mmm), or '-'."""
    stamps = [m.group(1) for line in lines if re.search(pattern, line) and (m := STAMP.match(line))]
    return max(stamps, default="-")


async def run(
    queues: int,
    groups: int,
    rounds: list[str],
    within: float,
    after: float,
    keep: str | None,
    pg: str = PG,
) -> None:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(keep or tmp) / "cluster"
        local = LocalCluster(root, f"{pg}?schema={schema}", COUNTS)
        try:
            local.up()
            async with AsyncClient(local.url, timeout=60) as client:
                started = time.monotonic()

                async def make(i: int) -> None:
                    await client.create_queue(f"q{i}")
                    for g in range(groups):
                        await client.create_group(f"q{i}", f"g{g}")

                await _each(queues, make, 16)
                made = time.monotonic() - started

                async def first(i: int) -> None:
                    await _publish(client, f"q{i}", f"b0-{i}", started + 600)

                await _each(queues, first)
                print(f"{queues} queues x {groups} groups made in {made:.1f} s, "
                      f"one message in each {time.monotonic() - started:.1f} s after the start",
                      flush=True)  # fmt: skip
                for r, what in enumerate(rounds):
                    names = {"controllers": local.names("controller"), "none": [],
                             "stores": local.names("storehost")}[what]  # fmt: skip
                    sizes = {n: local.procs[n].log.stat().st_size for n in local.procs}
                    calls = await asyncio.to_thread(_calls, local)
                    for name in names:
                        local.signal(name, signal.SIGKILL)
                    for name in names:
                        popen = local.procs[name].popen
                        assert popen is not None
                        await asyncio.to_thread(popen.wait, 20)
                    killed = time.strftime("%H:%M:%S")
                    if what == "stores":  # down until counted dead and the leader tried
                        while await asyncio.to_thread(_live_stores, pg, schema) or not any(
                            "no replica of extent" in line
                            for line in _lines(local, "controller", sizes)
                        ):
                            await asyncio.sleep(0.2)
                    restarted = time.monotonic()
                    at = time.strftime("%H:%M:%S")
                    await asyncio.to_thread(local.restart, *names)
                    cpu = _cpu(local)  # the restarted processes' count from their start
                    listening = time.monotonic() - restarted
                    delivered, late, lost, missed, seen, ready = await _served(
                        client, queues, groups, (f"b{r}", f"a{r}"), restarted + within, after
                    )
                    back = time.monotonic() - restarted
                    now_cpu = _cpu(local)
                    print("  CPU seconds in the round: " + ", ".join(
                        f"{n} {now_cpu[n] - cpu.get(n, 0.0):.1f}" for n in sorted(now_cpu)
                    ), flush=True)  # fmt: skip
                    print(_calls_line(calls, await asyncio.to_thread(_calls, local)), flush=True)
                    leader = [m.group(0) for line in _lines(local, "controller", sizes)
                              if (m := REPLACED.search(line))]  # fmt: skip
                    took = _last(_lines(local, "outputhost", sizes), r" takes \S+ extent ")
                    print(f"{what} (killed {killed}, restarted {at}): served again in "
                          f"{back:.1f} s (listening after {listening:.1f} s); delivered "
                          f"{delivered} within {within:.0f} s, {late} more within {after:.0f} s "
                          f"after, never {lost}; leader: {leader or '-'}; the output host's "
                          f"last take {took}", flush=True)  # fmt: skip
                    # when the deliveries came, from the check's start (after the publishes)
                    marks = [seen[int(len(seen) * f) - 1] for f in (0.5, 0.9, 0.99, 1.0) if seen]
                    print("  deliveries seen by (s from the check's start): 50/90/99/100%: "
                          + "/".join(f"{m:.1f}" for m in marks), flush=True)  # fmt: skip
                    # the same, from the end of each group's last empty receive before
                    marks = [ready[int(len(ready) * f) - 1] for f in (0.5, 0.9, 0.99, 1.0)
                             if ready]  # fmt: skip
                    print("  not there before (s from the check's start): 50/90/99/100%: "
                          + "/".join(f"{m:.1f}" for m in marks), flush=True)  # fmt: skip
                    if missed:
                        shown = " ".join(missed[:20]) + (" ..." if len(missed) > 20 else "")
                        print(f"  groups missing a delivery at {within:.0f} s: {shown}", flush=True)

                    async def next_(i: int, tag: str = f"b{r + 1}") -> None:
                        await _publish(client, f"q{i}", f"{tag}-{i}", time.monotonic() + 120)

                    await _each(queues, next_)
        finally:
            local.down()
            with psycopg.connect(pg, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--rounds", default="controllers,stores",
                        help="comma-separated: controllers, stores, none")  # fmt: skip
    parser.add_argument("--within", type=float, default=180.0,
                        help="seconds a round may take (its bound)")  # fmt: skip
    parser.add_argument("--after", type=float, default=60.0,
                        help="seconds to look on for what the round missed (then every group still "
                             "missing one is asked once more); what is missing "
                             "then is lost")  # fmt: skip
    parser.add_argument("--pg", default=PG,
                        help="the PostgreSQL holding the metadata (a private one with a "
                             "larger max_connections spares a shared one)")  # fmt: skip
    parser.add_argument("--keep", help="a directory to leave the cluster's logs and data in")
    args = parser.parse_args()
    asyncio.run(
        run(
            args.queues,
            args.groups,
            args.rounds.split(","),
            args.within,
            args.after,
            args.keep,
            args.pg,
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
