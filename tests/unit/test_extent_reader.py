"""The output host's extent reader picks replicas in turn and does not take one replica's
word for the end of a sealed extent. The store hosts are replaced by canned answers
here (the reader's choices are the logic under test); the real ones are exercised by the
integration and fault suites."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from cherami.errors import Unavailable
from cherami.metadata.models import AckLevel, Extent
from cherami.roles.outputhost import extentreader
from cherami.roles.outputhost.extentreader import ExtentCursor, read_extent
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.wire.keys import plain_key, seq_of
from cherami.wire.records import Record, encode_record
from cherami.wire.store import PLAIN, ReadResult


class _Replica:
    """A sealed replica holding sequence numbers 1..last."""

    def __init__(self, last: int) -> None:
        self.last = last
        self.reads = 0

    async def read(self, extent: str, after: bytes, max_count: int, **_: Any) -> ReadResult:
        self.reads += 1
        start = seq_of(after) + 1 if after else 1
        seqs = list(range(start, min(self.last, start + max_count - 1) + 1))
        records = [encode_record(Record(1, 1, f"m{s}".encode())) for s in seqs]
        end = (seqs[-1] if seqs else start - 1) >= self.last
        return ReadResult(0, [plain_key(s) for s in seqs], records, end)


class _Stores:
    def __init__(self, replicas: dict[str, _Replica]) -> None:
        self.replicas = replicas

    def get(self, store_id: str) -> _Replica:
        return self.replicas[store_id]


class _Group:
    key = "q/g"
    delay_ms = 0
    stopped = False

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def wait_for_room(self, cursor: ExtentCursor) -> int:
        return 3

    async def admit(self, run: Any) -> None:
        self.bodies += [r.body for r in run.records]

    def read_further(self) -> None:
        pass


def _read(replicas: dict[str, _Replica]) -> list[bytes]:
    extent = Extent(id="e1", queue="q", kind=PLAIN, status="sealed", input_host="i",
                    stores=list(replicas), created_at=0.0, sealed_seq=8)  # fmt: skip
    cursor = ExtentCursor(extent, AckLevel(queue="q", group="g", extent="e1", level=b"", acked=0))
    group = _Group()
    reads = SharedReads(_Stores(replicas))  # type: ignore[arg-type]
    asyncio.run(read_extent(group, cursor, reads))  # type: ignore[arg-type]
    assert cursor.read_done
    return group.bodies


def test_reads_take_turns_over_the_replicas() -> None:
    replicas = {"a": _Replica(8), "b": _Replica(8), "c": _Replica(8)}
    assert _read(replicas) == [f"m{s}".encode() for s in range(1, 9)]
    assert all(r.reads >= 1 for r in replicas.values())


def test_a_short_replica_does_not_end_the_extent_early() -> None:
    # "a" was cut off while the extent was sealed: it holds 5 of the 8 records
    for first in ("a", "b", "c"):
        replicas = {"a": _Replica(5), "b": _Replica(8), "c": _Replica(8)}
        ordered = {first: replicas[first], **replicas}
        assert _read(ordered) == [f"m{s}".encode() for s in range(1, 9)], first


class _Down(_Replica):
    """A replica whose store host is down for its first ``down`` reads."""

    def __init__(self, last: int, down: int) -> None:
        super().__init__(last)
        self.down = down

    async def read(self, extent: str, after: bytes, max_count: int, **kw: Any) -> ReadResult:
        if self.down:
            self.down -= 1
            raise Unavailable("connection refused")
        return await super().read(extent, after, max_count, **kw)


def test_a_reader_whose_replicas_are_all_down_pauses_longer_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A power loss left 400 readers trying 3 dead replicas every 0.5 s: 2,400 failed
    connects and warnings a second on the output host while the store hosts restarted.
    The pause grows to PAUSE_MOST, and each replica's failing streak is one warning."""
    pauses: list[float] = []

    waited = asyncio.sleep  # the module's sleep: other threads' loops still wait on it

    async def pause(seconds: float) -> None:  # the reader's clock, not waited out
        if threading.current_thread() is not threading.main_thread():
            await waited(seconds)  # a client's loop left running by an earlier test
            return
        pauses.append(seconds)

    monkeypatch.setattr(extentreader.asyncio, "sleep", pause)
    replicas = {name: _Down(8, down=12) for name in ("a", "b", "c")}
    with caplog.at_level(logging.DEBUG, logger=extentreader.log.name):
        assert _read(replicas) == [f"m{s}".encode() for s in range(1, 9)]
    assert pauses[:3] == [0.5, 1.0, 2.0] and set(pauses[3:]) == {2.0}, pauses
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3, [r.getMessage() for r in warned]
