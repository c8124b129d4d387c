"""The key layout of RocksExtentStore (rocks.py) and the scans that read it back.

Every extent's records share one column family, each key prefixed with the extent's name
(a length byte, then the name), so an extent's records are one key range: a prefixed
iterator shows them with the keys as the extent keys them. A plain extent holds one
value per append (the msgpack array of its records, keyed by its first sequence number),
split back into per-message keys and records by ``scan_plain``; a timer extent holds one
key per message, ordered by (delivery time, sequence number), read by ``scan``."""

from __future__ import annotations

from typing import Any, cast

from rocksdict import ReadOptions

from cherami.storage.base import ExtentMeta, ReadBatch, StorageError
from cherami.wire.keys import plain_key, plain_keys, seq_of
from cherami.wire.store import TIMER, unpack_records


def extent_prefix(extent: str) -> bytes:
    """The keys of an extent in the shared column family start with this."""
    name = extent.encode()
    if not 0 < len(name) < 256:
        raise StorageError("invalid_request", f"extent name {extent!r} must be 1-255 bytes")
    return bytes((len(name),)) + name


def after_prefix(prefix: bytes) -> bytes:
    """The first key past every key that starts with ``prefix`` (its length byte makes
    the name's last byte never the end of a longer prefix)."""
    return prefix + b"\xff" * 17  # longer than any key of an extent (timer: 16 bytes)


class _Prefixed:
    """An iterator of the shared column family, bounded to one extent's keys (its
    ReadOptions), that shows the keys without the extent's prefix (what the scans and
    seals expect)."""

    __slots__ = ("_it", "_prefix", "_n", "_bounds")

    def __init__(self, it: Any, prefix: bytes, bounds: ReadOptions) -> None:
        self._it = it
        self._prefix = prefix
        self._n = len(prefix)
        self._bounds = bounds  # kept while the iterator lives

    def seek(self, key: bytes) -> None:
        self._it.seek(self._prefix + key)

    def seek_for_prev(self, key: bytes) -> None:
        self._it.seek_for_prev(self._prefix + key)

    def seek_to_first(self) -> None:
        self._it.seek(self._prefix)

    def valid(self) -> bool:
        # the bounds are checked here too: seek_to_first and seek_for_prev have been
        # seen to pass the lower bound
        it = self._it
        return bool(it.valid()) and it.key()[: self._n] == self._prefix

    def key(self) -> bytes:
        return bytes(self._it.key()[self._n :])

    def value(self) -> bytes:
        return cast(bytes, self._it.value())

    def next(self) -> None:
        self._it.next()


def prefixed_iter(view: Any, extent: str) -> Any:
    """An iterator over one extent's records in the shared column family (``view``),
    keyed as the extent keys them."""
    prefix = extent_prefix(extent)
    bounds = ReadOptions()
    bounds.set_iterate_lower_bound(prefix)
    bounds.set_iterate_upper_bound(after_prefix(prefix))
    return _Prefixed(view.iter(bounds), prefix, bounds)


def seek_value_holding(it: Any, seq: int) -> None:
    """Position a plain extent's iterator on the value holding ``seq`` (the last value
    keyed at or below it), or on the first value when every value starts above it."""
    it.seek_for_prev(plain_key(seq))
    if not it.valid():
        it.seek_to_first()


def scan_plain(
    it: Any, meta: ExtentMeta, after: bytes, max_count: int, max_bytes: int, max_seq: int
) -> ReadBatch:
    """Per-message keys and records after ``after`` from the per-append values."""
    start = seq_of(after) + 1 if after else 1
    limit = meta.last_seq if max_seq < 0 else min(max_seq, meta.last_seq)
    keys: list[bytes] = []
    records: list[bytes] = []
    size = 0
    seek_value_holding(it, start)
    while it.valid() and len(records) < max_count and size < max_bytes:
        first = seq_of(it.key())
        if first > limit:
            break
        values = unpack_records(it.value())
        lo = max(start - first, 0)
        hi = min(len(values), limit - first + 1, lo + max_count - len(records))
        if lo < hi:
            part = values[lo:hi]
            part_size = sum(map(len, part))
            if size + part_size >= max_bytes:  # stop just past max_bytes, as per message
                taken = 0
                for record in part:
                    taken += 1
                    size += len(record)
                    if size >= max_bytes:
                        break
                part = part[:taken]
            else:
                size += part_size
            keys.extend(plain_keys(first + lo, len(part)))
            records.extend(part)
            start = first + lo + len(part)
        it.next()
    end = meta.sealed and start > meta.last_seq
    return ReadBatch(keys, records, end)


def scan(
    it: Any,
    meta: ExtentMeta,
    after: bytes,
    max_count: int,
    until_ms: int,
    max_bytes: int,
    max_seq: int,
) -> ReadBatch:
    if after:
        it.seek(after)
        if it.valid() and it.key() == after:
            it.next()
    else:
        it.seek_to_first()
    keys: list[bytes] = []
    records: list[bytes] = []
    size = 0
    timer = meta.kind == TIMER
    while it.valid() and len(keys) < max_count and size < max_bytes:
        key = it.key()
        if timer and until_ms and int.from_bytes(key[:8], "big") > until_ms:
            return ReadBatch(keys, records, False)
        if max_seq >= 0 and int.from_bytes(key[-8:], "big") > max_seq:
            return ReadBatch(keys, records, False)
        value = it.value()
        keys.append(key)
        records.append(value)
        size += len(value)
        it.next()
    end = meta.sealed and not it.valid()
    return ReadBatch(keys, records, end)
