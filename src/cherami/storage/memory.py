"""An in-memory ``ExtentStore``: the reference the contract suite holds RocksDB to, and
a fast stand-in for unit tests. Nothing survives the process."""

from __future__ import annotations

import bisect

from cherami.storage.base import AppendOp, ExtentMeta, ReadBatch, StorageError, check_append
from cherami.wire.keys import plain_keys, seq_of, timer_key
from cherami.wire.store import PLAIN, TIMER, ExtentInfo


class _Replica:
    def __init__(self, kind: str) -> None:
        self.meta = ExtentMeta(kind)
        self.keys: list[bytes] = []
        self.values: dict[bytes, bytes] = {}


class MemoryExtentStore:
    def __init__(self) -> None:
        self._replicas: dict[str, _Replica] = {}

    def create_extent(self, extent: str, kind: str) -> None:
        if kind not in (PLAIN, TIMER):
            raise StorageError("invalid_request", f"unknown extent kind {kind!r}")
        self._replicas.setdefault(extent, _Replica(kind))

    def append(self, ops: list[AppendOp]) -> list[int | StorageError]:
        results: list[int | StorageError] = []
        for op in ops:
            replica = self._replicas.get(op.extent)
            try:
                new = check_append(replica.meta if replica else None, op)
            except StorageError as err:
                results.append(err)
                continue
            assert replica is not None
            if new:
                if replica.meta.kind == TIMER:
                    assert op.delivery_ms is not None
                    keys = [timer_key(d, op.first_seq + i) for i, d in enumerate(op.delivery_ms)]
                else:
                    keys = plain_keys(op.first_seq, new)
                for key, record in zip(keys, op.unpacked(), strict=True):
                    bisect.insort(replica.keys, key)
                    replica.values[key] = record
                replica.meta.last_seq = op.first_seq + new - 1
                replica.meta.count += new
                replica.meta.bytes += op.size
            results.append(replica.meta.last_seq)
        return results

    def read(
        self,
        extent: str,
        after: bytes,
        max_count: int,
        until_ms: int = 0,
        max_bytes: int = 1 << 20,
        max_seq: int = -1,
    ) -> ReadBatch:
        replica = self._require(extent)
        start = bisect.bisect_right(replica.keys, after) if after else 0
        keys: list[bytes] = []
        records: list[bytes] = []
        size = 0
        index = start
        while index < len(replica.keys) and len(keys) < max_count and size < max_bytes:
            key = replica.keys[index]
            if (
                replica.meta.kind == TIMER
                and until_ms
                and int.from_bytes(key[:8], "big") > until_ms
            ):
                return ReadBatch(keys, records, False)
            if max_seq >= 0 and int.from_bytes(key[-8:], "big") > max_seq:
                return ReadBatch(keys, records, False)
            keys.append(key)
            records.append(replica.values[key])
            size += len(records[-1])
            index += 1
        return ReadBatch(keys, records, replica.meta.sealed and index >= len(replica.keys))

    def seal(self, extent: str, at_seq: int = -1) -> int:
        replica = self._require(extent)
        meta = replica.meta
        if meta.sealed and not 0 <= at_seq < meta.last_seq:
            return meta.last_seq
        if 0 <= at_seq < meta.last_seq:
            for key in [k for k in replica.keys if seq_of(k) > at_seq]:
                replica.keys.remove(key)
                meta.count -= 1
                meta.bytes -= len(replica.values.pop(key))
            meta.last_seq = at_seq
        meta.sealed = True
        return meta.last_seq

    def info(self, extent: str) -> ExtentInfo:
        replica = self._replicas.get(extent)
        if replica is None:
            return ExtentInfo(extent, PLAIN, 0, 0, 0, False, exists=False)
        return replica.meta.as_info(extent)

    def extents(self) -> list[str]:
        return sorted(self._replicas)

    def drop(self, extent: str) -> None:
        self._replicas.pop(extent, None)

    def unflushed_bytes(self) -> int:
        return 0

    def limit_unflushed(self, max_bytes: int) -> None:
        return None

    def _require(self, extent: str) -> _Replica:
        replica = self._replicas.get(extent)
        if replica is None:
            raise StorageError("extent_not_found", f"no extent {extent}")
        return replica

    def close(self) -> None:
        self._replicas.clear()
