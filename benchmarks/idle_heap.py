"""The Python heap an idle queue costs a node (issue 29): a node in this process
(in-process store hosts, SQLite metadata), N queues of G groups with one message each,
then the heap traced by tracemalloc before and after, per queue, with the biggest
growth by file. With --consume, each group receives its message once (loading it) and
is then left idle for the node to unload it (timing.group_idle_unload, given here).

    .venv/bin/python benchmarks/idle_heap.py 400
    .venv/bin/python benchmarks/idle_heap.py --consume --unload 1 400

Prints the heap per queue (KB) and the 12 files whose allocations grew most."""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.inprocess import InProcessNode  # noqa: E402

from cherami.client.asyncclient import AsyncClient  # noqa: E402


async def _fill(url: str, queues: int, groups: int, consume: bool) -> None:
    async with AsyncClient(url, timeout=120) as client:
        limit = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with limit:
                await client.create_queue(f"q{i}")
                for g in range(groups):
                    await client.create_group(f"q{i}", f"g{g}")
                await client.publish(f"q{i}", [f"m{i}"])
                for g in range(groups if consume else 0):
                    got = await client.receive(f"q{i}", f"g{g}", max_messages=1, wait_seconds=5)
                    await client.ack(f"q{i}", f"g{g}", got)

        await asyncio.gather(*(one(i) for i in range(queues)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("queues", type=int)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--consume", action="store_true")
    parser.add_argument("--unload", type=float, default=None, help="timing.group_idle_unload")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle before the look")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = {}
        if args.unload is not None:
            from cherami.timing import Timing  # noqa: PLC0415

            config["timing"] = Timing(group_idle_unload=args.unload)
        tracemalloc.start(1)
        node = InProcessNode(Path(tmp) / "node", **config).start()
        try:
            time.sleep(args.settle)
            gc.collect()
            before = tracemalloc.take_snapshot()
            asyncio.run(_fill(node.url, args.queues, args.groups, args.consume))
            time.sleep(args.settle + (args.unload or 0) * 2)  # idle; unloaded by then
            gc.collect()
            after = tracemalloc.take_snapshot()
            assert node.node is not None and node.node.roles is not None
            outputs = node.node.roles.outputs
            loaded = "?" if outputs is None else len(outputs.service.groups)
        finally:
            node.stop()
    stats = after.compare_to(before, "filename")
    grown = sum(s.size_diff for s in stats)
    print(f"{args.queues} queues x {args.groups} groups, consumed: {args.consume}: "
          f"{grown / args.queues / 1024:.1f} KB of heap a queue, "
          f"{loaded} groups loaded")  # fmt: skip
    for s in stats[:12]:
        print(f"  {s.size_diff / args.queues:8.0f} B/queue  {s.traceback[0].filename}")
    for s in after.compare_to(before, "lineno")[:12]:
        frame = s.traceback[0]
        print(f"  {s.size_diff / args.queues:8.0f} B/queue  {frame.filename}:{frame.lineno}")


if __name__ == "__main__":
    main()
