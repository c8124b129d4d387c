"""boto3 through the SQS endpoint beside the native HTTP API, on one node in one run
(issue 32): the same messages, the same clients and batch sizes on both paths.

    python benchmarks/sqs_bench.py [--messages 20000] [--clients 4] [--size 256]
                                   [--replicas 3] [--fifo-groups 64] [--json FILE]

Starts a node (3 store hosts) with ``--sqs-port 0``. Phases, each over its own queue:

- ``sqs send``: boto3 ``send_message_batch``, 10 messages a call (SQS's most), one call
  in flight per client thread;
- ``sqs receive+delete``: ``receive_message`` (10, long poll 1 s) then
  ``delete_message_batch`` of what it got, until every message is deleted;
- ``sqs send (1 a call)``: ``send_message``, a fifth of the messages;
- ``sqs fifo send`` and ``sqs fifo receive+delete``: the first two on a FIFO queue, each
  message with one of ``--fifo-groups`` MessageGroupIds (in turn) and its own
  MessageDeduplicationId (docs/sqs.md, "FIFO queues");
- ``http publish`` and ``http receive+ack``: the Python client on the HTTP API with the
  same batches of 10 (benchmarks/http_path.py's phases), and with 500 (its default).

Each client is a thread with its own boto3 client (boto3's default retries); the HTTP
clients are asyncio tasks. Prints msgs/s per phase, and the CPU seconds of the node (with
its store hosts) and of the clients' process in it."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cherami.client.asyncclient import AsyncClient  # noqa: E402
from cherami.devcluster.nodeproc import NodeProcess  # noqa: E402
from http_path import _cpu, publish, receive_ack  # noqa: E402


def sqs_client(url: str) -> Any:
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="bench", aws_secret_access_key="bench")  # fmt: skip


def in_threads(clients: int, work: Callable[[Any], None], url: str) -> float:
    """Run ``work(client)`` in each thread; the wall seconds until all are done."""
    made = [sqs_client(url) for _ in range(clients)]
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(work, c) for c in made]:
            future.result()
    return time.perf_counter() - start


def sqs_send(
    url: str, queue_url: str, total: int, clients: int, size: int, batch: int, groups: int = 0
) -> float:
    """``groups``: a FIFO queue's, each message in one of them, with its own dedup id."""
    body = "x" * size
    share = total // clients

    def entry(i: int) -> dict[str, str]:
        if not groups:
            return {"Id": str(i), "MessageBody": body}
        return {"Id": str(i), "MessageBody": body, "MessageGroupId": f"g{next(turn) % groups}",
                "MessageDeduplicationId": uuid.uuid4().hex}  # fmt: skip

    turn = itertools.count()

    def work(client: Any) -> None:
        for sent in range(0, share, batch):
            n = min(batch, share - sent)
            if batch == 1:
                client.send_message(QueueUrl=queue_url, MessageBody=body)
                continue
            entries = [entry(i) for i in range(n)]
            answer = client.send_message_batch(QueueUrl=queue_url, Entries=entries)
            assert not answer.get("Failed"), answer["Failed"]

    return share * clients / in_threads(clients, work, url)


def sqs_receive_delete(url: str, queue_url: str, total: int, clients: int) -> float:
    deleted = 0
    lock = threading.Lock()
    done = threading.Event()
    ended = 0.0

    def work(client: Any) -> None:
        nonlocal deleted, ended
        while not done.is_set():
            got = client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                         WaitTimeSeconds=1).get("Messages", [])  # fmt: skip
            if not got:
                continue
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ]
            answer = client.delete_message_batch(QueueUrl=queue_url, Entries=entries)
            with lock:
                deleted += len(answer["Successful"])
                if deleted >= total and not done.is_set():
                    ended = time.perf_counter()
                    done.set()

    start = time.perf_counter()
    in_threads(clients, work, url)
    return deleted / (ended - start)


def record(table: dict[str, Any], name: str, rate: float, cpu: float, client: float) -> None:
    table[name] = {"msgs_per_s": round(rate), "node_cpu_s": round(cpu, 1),
                   "client_cpu_s": round(client, 1)}  # fmt: skip
    print(f"{name:34} {rate:10,.0f} msgs/s   node CPU {cpu:5.1f} s   client CPU {client:5.1f} s",
          flush=True)  # fmt: skip


def measure(pid: int, name: str, run: Callable[[], float], table: dict[str, Any]) -> None:
    cpu, client = _cpu(pid), time.process_time()
    rate = run()
    record(table, name, rate, _cpu(pid) - cpu, time.process_time() - client)


def sqs_phases(sqs: str, pid: int, args: argparse.Namespace, table: dict[str, Any]) -> None:
    boto = sqs_client(sqs)
    attrs = {"VisibilityTimeout": "60"}
    url = boto.create_queue(QueueName=f"sqs-{uuid.uuid4().hex[:8]}", Attributes=attrs)["QueueUrl"]
    n, c, size = args.messages, args.clients, args.size
    measure(pid, "sqs send (10 a call)", lambda: sqs_send(sqs, url, n, c, size, 10), table)
    measure(
        pid, "sqs receive+delete (10 a call)", lambda: sqs_receive_delete(sqs, url, n, c), table
    )
    one = boto.create_queue(QueueName=f"sqs-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    measure(pid, "sqs send (1 a call)", lambda: sqs_send(sqs, one, n // 5, c, size, 1), table)
    fifo = boto.create_queue(QueueName=f"sqs-{uuid.uuid4().hex[:8]}.fifo",
                             Attributes={**attrs, "FifoQueue": "true"})["QueueUrl"]  # fmt: skip
    g = args.fifo_groups
    measure(pid, "sqs fifo send (10 a call)", lambda: sqs_send(sqs, fifo, n, c, size, 10, g), table)
    measure(pid, "sqs fifo receive+delete (10 a call)",
            lambda: sqs_receive_delete(sqs, fifo, n, c), table)  # fmt: skip


async def http_phases(url: str, pid: int, args: argparse.Namespace, table: dict[str, Any]) -> None:
    n, c = args.messages, args.clients
    for batch in (10, 500):
        queue = f"http-{batch}-{uuid.uuid4().hex[:8]}"
        async with AsyncClient(url) as client:
            await client.create_queue(queue, replicas=args.replicas)
            await client.create_group(queue, "workers", visibility_timeout_seconds=60)
        cpu, client = _cpu(pid), time.process_time()
        rate = await publish(url, queue, n, c, batch, args.size)
        record(table, f"http publish ({batch} a call)", rate, _cpu(pid) - cpu,
               time.process_time() - client)  # fmt: skip
        cpu, client = _cpu(pid), time.process_time()
        rate = await receive_ack(url, queue, n, c, batch)
        record(table, f"http receive+ack ({batch} a call)", rate, _cpu(pid) - cpu,
               time.process_time() - client)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--fifo-groups", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "node", stores=args.replicas, extra=["--sqs-port", "0"])
        node.start()
        try:
            assert node.proc is not None
            sqs = next(line.split(" at ")[1] for line in node.output if "SQS endpoint at" in line)
            table: dict[str, Any] = {"messages": args.messages, "clients": args.clients,
                                     "size": args.size, "replicas": args.replicas}  # fmt: skip
            sqs_phases(sqs, node.proc.pid, args, table)
            asyncio.run(http_phases(node.url, node.proc.pid, args, table))
        finally:
            node.stop()
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
