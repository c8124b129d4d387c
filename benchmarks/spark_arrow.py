"""CPU per row of what a Spark worker does with a store reply, without sockets or Spark.

Builds store replies (``ReadResult`` frames) of R records of S-byte bodies, then times
decoding each frame, turning it into an Arrow record batch (``schema.arrow_batches``)
and writing that batch in Arrow IPC to a buffer (what pyspark does to hand it to the
JVM). Prints microseconds of CPU per row (process time, so less noisy than wall time on
a shared machine), best of a few rounds.

    python benchmarks/spark_arrow.py [--rows 4096] [--size 256] [--rounds 5] [--attributes]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from cherami.spark.schema import SCHEMA, arrow_batches, arrow_schema  # noqa: E402
from cherami.spark.storereader import Batch  # noqa: E402
from cherami.wire import store as w  # noqa: E402
from cherami.wire.keys import plain_key  # noqa: E402
from cherami.wire.records import Record, encode_record  # noqa: E402

TOTAL = 200_000


def frames(rows: int, size: int, attributes: bool) -> list[bytes]:
    """Encoded replies holding ``TOTAL`` records in all, ``rows`` per reply."""
    body = b"x" * size
    now = int(time.time() * 1000)
    attrs = {"kind": "crash", "app": "demo"} if attributes else None
    out = []
    for first in range(1, TOTAL + 1, rows):
        seqs = range(first, min(first + rows, TOTAL + 1))
        records = [encode_record(Record(now, now, body, attrs)) for _ in seqs]
        out.append(w.encode(w.ReadResult(1, [plain_key(s) for s in seqs], records, False)))
    return out


def replies(raw: list[bytes]) -> list[Batch]:
    out = []
    for frame in raw:
        reply = w.decode_reply(frame)
        assert isinstance(reply, w.ReadResult)
        out.append(Batch(reply.keys, reply.records))
    return out


def run(raw: list[bytes]) -> float:
    """CPU seconds to decode, convert and serialise every reply."""
    started = time.process_time()
    target = pa.BufferOutputStream()
    schema = arrow_schema(SCHEMA.json())
    with pa.ipc.new_stream(target, schema) as ipc:
        for batch in arrow_batches(SCHEMA, "0123456789abcdef", iter(replies(raw))):
            ipc.write_batch(batch)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=4096, help="records per store reply")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attributes", action="store_true", help="two attributes a message")
    args = parser.parse_args()
    raw = frames(args.rows, args.size, args.attributes)
    best = min(run(raw) for _ in range(args.rounds))
    print(f"{TOTAL:,} rows in replies of {args.rows:,} x {args.size} B"
          f"{' with attributes' if args.attributes else ''}: {best / TOTAL * 1e6:.3f} us CPU "
          f"per row ({TOTAL / best:,.0f} rows per CPU-second)")  # fmt: skip


if __name__ == "__main__":
    main()
