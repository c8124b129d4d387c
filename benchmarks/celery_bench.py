"""Celery on Cherami beside Celery on Redis and RabbitMQ: the same app
(tests/support/celeryapp.py), the same worker (``celery worker -c 2``, prefork, prefetch
multiplier 4, ``acks_late``), the same task, one broker after the other in one run.

For each broker it measures, with one worker process running:

- **latency**: one task at a time on an idle queue, from the ``apply_async`` call to the
  moment the task body runs (the time it writes), ``--latency-tasks`` times: p50 and max;
- **tasks/s**: ``--tasks`` tasks published by one thread, one ``apply_async`` after the
  other, from the first call to the last task's run; and the publish rate alone;
- **backlog drain**: the worker stops consuming (``cancel_consumer``), ``--tasks`` tasks
  are published, it consumes again (``add_consumer``): tasks/s from then to the last run,
  what the worker does when publishing is not the limit.

Every task appends one line to a file, the count the runs wait for (and check: every task
ran, none twice). Cherami runs twice: as the transport ships (each publish returns once
the message is fsynced on every replica) and with ``confirm_publish: False`` (the publish
returns once sent, as Celery on RabbitMQ does without publisher confirms).

    .venv/bin/python benchmarks/celery_bench.py                 # starts a node (3 replicas)
    .venv/bin/python benchmarks/celery_bench.py --tasks 1000 --only cherami,redis
    .venv/bin/python benchmarks/celery_bench.py --cherami-url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cherami.devcluster.nodeproc import NodeProcess  # noqa: E402

REDIS = "redis://127.0.0.1:6379/0"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


def durability(key: str, url: str) -> str:
    """What a broker promises for a published task, read from the server where it can be."""
    if key.startswith("cherami"):
        confirm = "once fsynced on every replica (3)" if key == "cherami" else "once sent"
        return f"Cherami node, 3 replicas fsynced per publish; apply_async returns {confirm}"
    if key == "redis":
        import redis

        client = redis.Redis.from_url(url)
        aof = client.config_get("appendonly")["appendonly"]
        fsync = client.config_get("appendfsync")["appendfsync"]
        save = client.config_get("save")["save"] or "none"
        version = client.info("server")["redis_version"]
        return f"Redis {version}: appendonly {aof} (appendfsync {fsync}), RDB save '{save}'"
    from kombu import Connection

    with Connection(url) as conn:
        conn.connect()
        version = conn.connection.server_properties.get("version", "?")
    return (
        f"RabbitMQ {version}: durable classic queue, persistent messages, "
        "no publisher confirms (Celery's default)"
    )


class Run:
    """One broker: a fresh queue, one worker, the app imported for that broker."""

    def __init__(self, key: str, url: str, options: dict[str, Any], work: Path) -> None:
        self.key, self.url = key, url
        self.queue = f"bench-celery-{uuid.uuid4().hex[:8]}"
        self.lines = work / f"{key}.txt"
        self.env = {
            **os.environ, "PYTHONPATH": str(ROOT), "CELERY_BROKER_URL": url,
            "CELERY_QUEUE": self.queue, "CELERY_QUEUE_B": self.queue + "-b", "CELERY_NODE": key,
        }  # fmt: skip
        os.environ.update({k: self.env[k] for k in ("CELERY_BROKER_URL", "CELERY_QUEUE")})
        sys.modules.pop("tests.support.celeryapp", None)
        self.mod: Any = importlib.import_module("tests.support.celeryapp")
        self.mod.app.conf.broker_transport_options = {
            **self.mod.app.conf.broker_transport_options, **options,
        }  # fmt: skip
        self.log = (work / f"{key}.worker.log").open("ab")
        self.worker: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> None:
        cmd = [
            sys.executable, "-m", "celery", "-A", "tests.support.celeryapp", "worker", "-c", "2",
            "-n", f"bench-{self.key}@%h", "-l", "warning", "--without-mingle", "--without-gossip",
        ]  # fmt: skip
        self.worker = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        node = f"bench-{self.key}@{os.uname().nodename}"
        deadline = time.monotonic() + 60
        while not self.mod.app.control.ping([node], timeout=1.0):
            if time.monotonic() > deadline or self.worker.poll() is not None:
                raise RuntimeError(f"the {self.key} worker did not start (see {self.log.name})")

    def ran(self) -> list[list[str]]:
        if not self.lines.exists():
            return []
        return [line.split() for line in self.lines.read_text().splitlines()]

    def wait_lines(self, count: int, timeout: float) -> list[list[str]]:
        deadline = time.monotonic() + timeout
        while len(lines := self.ran()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.key}: {len(lines)} of {count} tasks ran in {timeout} s")
            time.sleep(0.002)
        return lines

    def latency(self, n: int) -> list[float]:
        path, out = str(self.lines), []
        for i in range(n):
            before = len(self.ran())
            start = time.time()
            self.mod.record.delay(path, f"lat{i}")
            out.append(float(self.wait_lines(before + 1, 30)[-1][4]) - start)
        return out

    def throughput(self, n: int) -> dict[str, float]:
        path, before = str(self.lines), len(self.ran())
        with self.mod.app.producer_or_acquire() as producer:
            start = time.time()
            for i in range(n):
                self.mod.record.apply_async((path, f"t{i}"), producer=producer)
            published = time.time()
        lines = self.wait_lines(before + n, 600)
        last = max(float(f[4]) for f in lines[before:])
        counts = Counter(f[1] for f in lines[before:])
        assert len(counts) == n and max(counts.values()) == 1, f"{self.key}: lost or repeated"
        return {"publish_per_s": n / (published - start), "tasks_per_s": n / (last - start)}

    def drain(self, n: int) -> float:
        """Tasks/s of the worker alone: it stops consuming (remote control), ``n`` tasks
        are published, it consumes again; from then to the last task's run."""
        control, node = self.mod.app.control, [f"bench-{self.key}@{os.uname().nodename}"]
        assert control.cancel_consumer(self.queue, destination=node, reply=True), "no reply"
        path, before = str(self.lines), len(self.ran())
        with self.mod.app.producer_or_acquire() as producer:
            for i in range(n):
                self.mod.record.apply_async((path, f"d{i}"), producer=producer)
        if self.key.startswith("cherami"):  # sent without confirm: wait until all are stored
            with self.mod.app.connection_for_write() as conn:
                while conn.default_channel._size(self.queue) < n:
                    time.sleep(0.05)
        start = time.time()
        assert control.add_consumer(self.queue, destination=node, reply=True), "no reply"
        lines = self.wait_lines(before + n, 600)
        assert len({f[1] for f in lines[before:]}) == n, f"{self.key}: lost tasks"
        return n / (max(float(f[4]) for f in lines[before:]) - start)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait(10)
        try:
            with self.mod.app.connection_for_write() as conn:
                conn.default_channel.queue_delete(self.queue)
        except Exception as err:  # noqa: BLE001 - the figures stand without it
            print(f"  ({self.key}: could not delete the queue: {err})")
        self.mod.app.close()
        self.log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--latency-tasks", type=int, default=50)
    parser.add_argument("--only", default="cherami,cherami-noconfirm,redis,rabbitmq")
    parser.add_argument("--cherami-url", default="", help="a running node (else one is started)")
    parser.add_argument("--json", default="", help="write the figures here too")
    args = parser.parse_args()
    keys = args.only.split(",")
    with tempfile.TemporaryDirectory(prefix="celery-bench-") as tmp:
        work = Path(tmp)
        node = None
        cherami_url = args.cherami_url
        if not cherami_url and any(k.startswith("cherami") for k in keys):
            node = NodeProcess(work / "node", stores=3).start()
            cherami_url = node.url
        brokers = {
            "cherami": ("cherami://" + cherami_url.split("://", 1)[-1], {}),
            "cherami-noconfirm": (
                "cherami://" + cherami_url.split("://", 1)[-1], {"confirm_publish": False},
            ),
            "redis": (REDIS, {}),
            "rabbitmq": (RABBITMQ, {}),
        }  # fmt: skip
        results: dict[str, dict[str, Any]] = {}
        try:
            for key in keys:
                url, options = brokers[key]
                run = Run(key, url, options, work)
                try:
                    run.start_worker()
                    lat = run.latency(args.latency_tasks)
                    figures = run.throughput(args.tasks)
                    figures["drain_per_s"] = run.drain(args.tasks)
                finally:
                    run.close()
                results[key] = {
                    **figures,
                    "latency_p50_ms": statistics.median(lat) * 1000,
                    "latency_max_ms": max(lat) * 1000,
                    "durability": durability(key, url),
                }
                print(key, json.dumps(results[key]), flush=True)
        finally:
            if node is not None:
                node.stop()
    print(f"\n{args.tasks} tasks, one producer thread, one worker (-c 2 prefork, prefetch x4, "
          f"acks_late); latency over {args.latency_tasks} single tasks\n")  # fmt: skip
    print("| broker | tasks/s | publish/s | backlog drain tasks/s | one task p50 ms | max ms "
          "| durability |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for key, r in results.items():
        rates = f"{r['tasks_per_s']:,.0f} | {r['publish_per_s']:,.0f} | {r['drain_per_s']:,.0f}"
        latency = f"{r['latency_p50_ms']:.1f} | {r['latency_max_ms']:.1f}"
        print(f"| {key} | {rates} | {latency} | {r['durability']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
