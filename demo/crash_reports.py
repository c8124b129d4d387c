"""The crash-report pipeline, end to end (``make demo``).

1. starts a Cherami node on the embedded default (3 RocksDB store hosts, SQLite);
2. creates the queue ``crash-reports`` with two consumer groups: ``processors``
   (competing: a pool of workers) and ``analytics`` (stream mode: Spark);
3. publishes synthetic Socorro-style crash reports at a steady rate, a few of them
   malformed; the workers process the good ones, and the malformed ones end in the
   group's dead-letter queue after 3 deliveries;
4. a Spark Structured Streaming job counts crashes per signature per minute into
   Parquet, with the group's acks following its checkpoint;
5. prints a report whose counts must reconcile (published = processed + dead-lettered;
   Spark's total = published), exits 1 when they do not, and stops what it started.

Run: ``python demo/crash_reports.py [--reports 5000] [--rate 1000] [--workers 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import shutil
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cherami.spark  # noqa: E402  (sets PYSPARK_PYTHON and SPARK_LOCAL_IP first)
from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.client.models import Received  # noqa: E402
from cherami.client.worker import Worker  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess  # noqa: E402
from demo.crashgen import CrashReports, parse  # noqa: E402
from demo.report import Reconcile, print_report  # noqa: E402
from demo.sparkjob import CrashAggregation  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from rich.progress import Progress

PROCESSORS, ANALYTICS = "processors", "analytics"


@dataclass
class DemoConfig:
    reports: int = 5000
    rate: float = 1000.0  # reports per second
    workers: int = 3
    concurrency: int = 8  # reports in flight per worker
    malformed_every: int = 97
    queue: str = "crash-reports"
    workdir: Path = field(default_factory=lambda: Path(__file__).resolve().parent / "out")
    trigger_seconds: float = 2.0
    master: str = "local[2]"
    timeout: float = 180.0
    quiet: bool = False

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)


@dataclass
class Processing:
    published: int = 0
    publish_seconds: float = 0.0
    processed: set[str] = field(default_factory=set)
    successes: int = 0
    dead_lettered: int = 0
    by_product: Counter[str] = field(default_factory=Counter)


async def setup(client: AsyncClient, queue: str) -> None:
    await client.create_queue(queue, min_extents=2)
    await client.create_group(
        queue, PROCESSORS, max_delivery_count=3, visibility_timeout_seconds=10
    )
    await client.create_group(queue, ANALYTICS, type="stream")


async def produce(client: AsyncClient, cfg: DemoConfig, reports: CrashReports,
                  progress: Progress | None) -> int:  # fmt: skip
    """Publish ``cfg.reports`` at ``cfg.rate`` per second; returns how many were acked."""
    loop = asyncio.get_running_loop()
    tick = 0.05
    per_tick = max(1, round(cfg.rate * tick))
    bar = progress.add_task("publishing crash reports", total=cfg.reports) if progress else None
    started, sent = loop.time(), 0
    futures = []
    async with client.publisher(cfg.queue) as publisher:
        while sent < cfg.reports:
            n = min(per_tick, cfg.reports - sent)
            future = await publisher.send([reports.next() for _ in range(n)])
            if progress is not None and bar is not None:
                future.add_done_callback(lambda f, n=n: progress.advance(bar, n))
            futures.append(future)
            sent += n
            delay = started + sent / cfg.rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        acked = await asyncio.gather(*futures)
    return sum(len(ids) for ids in acked)


async def process(url: str, cfg: DemoConfig, reports: CrashReports,
                  progress: Progress | None) -> Processing:  # fmt: skip
    """Publish while a pool of workers processes; return once every report is either
    processed or dead-lettered (or the timeout passed)."""
    state = Processing()

    async def handle(message: Received) -> None:
        report = parse(message.body)  # raises on a malformed report: nack, then DLQ
        state.by_product[str(report["product"])] += 1
        state.processed.add(message.id)
        state.successes += 1

    async with AsyncClient(url) as client:
        workers = [
            Worker(client, cfg.queue, PROCESSORS, handle, cfg.concurrency,
                   nack_backoff=(0.05, 2.0, 0.5), stop_signals=False)
            for _ in range(cfg.workers)
        ]  # fmt: skip
        running = [asyncio.create_task(w.run()) for w in workers]
        try:
            started = time.monotonic()
            state.published = await produce(client, cfg, reports, progress)
            state.publish_seconds = time.monotonic() - started
            deadline = time.monotonic() + cfg.timeout
            while time.monotonic() < deadline:
                group = await client.get_group(cfg.queue, PROCESSORS)
                state.dead_lettered = int(group["stats"]["dlq_depth"])
                if len(state.processed) + state.dead_lettered >= state.published:
                    break
                await asyncio.sleep(0.2)
        finally:
            for worker in workers:
                worker.stop()
            await asyncio.gather(*running, return_exceptions=True)
    return state


def run(cfg: DemoConfig, spark: SparkSession | None = None, url: str | None = None) -> Reconcile:
    """Run the pipeline; start a node and a Spark session unless given. Everything this
    starts is stopped before it returns."""
    from rich.progress import Progress

    node: NodeProcess | None = None
    own_spark = spark is None
    aggregation: CrashAggregation | None = None
    shutil.rmtree(cfg.workdir / "node", ignore_errors=True)
    try:
        if url is None:
            cfg.say("starting a Cherami node (3 store hosts, SQLite metadata)...")
            node = NodeProcess(cfg.workdir / "node").start()
            url = node.url  # Spark reads its store hosts with read grants, no secret
            cfg.say(f"node up at {url}")
        asyncio.run(_with_client(url, lambda c: setup(c, cfg.queue)))
        if spark is None:
            cfg.say(f"starting Spark ({cfg.master})...")
            spark = cherami.spark.session("crash-reports", master=cfg.master,
                                          **{"spark.ui.showConsoleProgress": "false"})  # fmt: skip
            spark.sparkContext.setLogLevel("ERROR")
        aggregation = CrashAggregation(spark, url, cfg.queue, ANALYTICS, cfg.workdir / "parquet")
        aggregation.start(cfg.trigger_seconds)
        cfg.say(f"Spark job on group '{ANALYTICS}' (stream mode) started; "
                f"{cfg.workers} workers on group '{PROCESSORS}' (competing)")  # fmt: skip
        reports = CrashReports(malformed_every=cfg.malformed_every)
        with Progress(disable=cfg.quiet, transient=False) as progress:
            state = asyncio.run(process(url, cfg, reports, progress))
        cfg.say("workers done; waiting for the Spark job to reach the end of the queue...")
        if not aggregation.wait_caught_up(cfg.timeout):
            print("the Spark job did not catch up in time", file=sys.stderr)
        aggregation.stop()
        rows = aggregation.finish()
        result = Reconcile.of(state.published, len(state.processed), state.dead_lettered,
                              state.successes - len(state.processed), reports.malformed, rows,
                              aggregation.result)  # fmt: skip
        return dataclasses.replace(result, publish_seconds=state.publish_seconds)
    finally:
        if aggregation is not None:
            aggregation.stop()
        if own_spark and spark is not None:
            spark.stop()
        if node is not None:
            node.stop()
            shutil.rmtree(cfg.workdir / "node", ignore_errors=True)  # keep only the results


async def _with_client(url: str, work: Any) -> Any:
    async with AsyncClient(url) as client:
        return await work(client)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reports", type=int, default=5000, help="crash reports to publish")
    parser.add_argument("--rate", type=float, default=1000.0, help="reports per second")
    parser.add_argument("--workers", type=int, default=3, help="workers in the competing group")
    parser.add_argument("--malformed-every", type=int, default=97,
                        help="every n-th report is malformed (0: none)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=DemoConfig().workdir,
                        help="node data, Spark checkpoint and Parquet output")  # fmt: skip
    parser.add_argument("--master", default="local[2]", help="Spark master")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("cherami.client.worker").setLevel(logging.ERROR)  # malformed: expected
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    cfg = DemoConfig(reports=args.reports, rate=args.rate, workers=args.workers,
                     malformed_every=args.malformed_every, workdir=args.workdir,
                     master=args.master)  # fmt: skip
    result = run(cfg)
    print_report(result)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
