"""The storage floor: how fast this machine's disk takes synced RocksDB writes when the
replicas of one extent write at the same time, with no network and no per-message Python.

Each writer is its own process with its own RocksDB directory (as each store host is) and
puts one value of ``--per`` records of ``--size`` bytes per synced write (the store hosts
keep one value per append of a plain extent, and the streaming publisher's frames hold up
to 400 messages). The writers start together; each reports its own rate. A publish to
R replicas is acked only when all R have synced, so with R writers on one disk the
slowest writer's rate is the most R-replica publishing can reach here, whatever the rest
of the system does.

    python benchmarks/storage_floor.py [--writers 1,3] [--messages 1000000] [--per 400]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from multiprocessing.queues import Queue
from pathlib import Path

from rocksdict import Options, Rdict, WriteOptions


def _writer(
    path: str, messages: int, per: int, size: int, go: Queue[bool], out: Queue[tuple[float, float]]
) -> None:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(path, opts)
    synced = WriteOptions()
    synced.sync = True
    value = os.urandom(per * size)
    go.get()
    wall, cpu = time.perf_counter(), time.process_time()
    for n in range(messages // per):
        db.put(n.to_bytes(8, "big"), value, synced)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    db.close()
    out.put((messages / wall, cpu / messages * 1e6))


def run(writers: int, messages: int, per: int, size: int, root: Path) -> list[tuple[float, float]]:
    ctx = mp.get_context("spawn")
    go: Queue[bool] = ctx.Queue()
    out: Queue[tuple[float, float]] = ctx.Queue()
    dirs = [root / f"writer-{i}" for i in range(writers)]
    procs = [ctx.Process(target=_writer, args=(str(d), messages, per, size, go, out)) for d in dirs]
    for proc in procs:
        proc.start()
    time.sleep(1.0)  # every writer has opened its database
    os.sync()
    for _ in procs:
        go.put(True)
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return sorted(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", default="1,3", help="comma-separated writer counts")
    parser.add_argument("--messages", type=int, default=1_000_000, help="per writer")
    parser.add_argument("--per", type=int, default=400, help="records per synced write")
    parser.add_argument("--size", type=int, default=290, help="bytes per stored record")
    parser.add_argument("--dir", default=None, help="where the databases go (default: temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cherami-floor-", dir=args.dir) as tmp:
        for writers in (int(w) for w in args.writers.split(",")):
            results = run(writers, args.messages, args.per, args.size, Path(tmp))
            rates = " | ".join(f"{r:,.0f} msgs/s ({cpu:.2f} µs CPU/msg)" for r, cpu in results)
            print(
                f"{writers} writer(s), {args.per} x {args.size} B per synced put, "
                f"{args.messages:,} messages each: {rates}; "
                f"floor for {writers}-replica publishing: {results[0][0]:,.0f} msgs/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
