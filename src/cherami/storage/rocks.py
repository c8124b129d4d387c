"""RocksDB storage (via rocksdict): every extent replica's records in one column family,
each key prefixed with its extent's name (a length byte, then the name), so dropping an
extent is one range deletion (no per-message deletes) and creating one writes a single
metadata row. (A column family per extent, as this store had before, cost a rewrite of
RocksDB's OPTIONS file listing every family at each create: 100-350 ms each with 100 to
1,000 extents, so a node could not hold many queues. Extents made that way are still
read, written and dropped in their own families.) Extent metadata lives in its own
column family, written in the same batch as the records it describes.

Plain extents keep one RocksDB value per append (keyed by its first sequence number,
holding the msgpack array of its records): far fewer keys to write, sync and scan than
one per message (benchmarks/README.md). Reads split the values back into per-message keys
and records, so callers see the same thing as from the per-message reference store.
Timer extents keep one key per message, ordered by (delivery time, sequence number).
The key layout and the scans that read it are in rockslayout.py.

Append rounds are made durable by the store's own journal (journal.py), not RocksDB's
WAL: they are written to the memtables without the WAL, after the round is synced in
the journal. Creates, seals and drops go through the WAL as before. On open, the
journal is replayed over what RocksDB recovered (see ``_replay``)."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace
from typing import Any, cast

import msgspec
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from cherami.storage import journal
from cherami.storage.base import (
    AppendOp,
    ExtentMeta,
    ReadBatch,
    StorageError,
    check_append,
)
from cherami.storage.rockslayout import (
    after_prefix,
    extent_prefix,
    prefixed_iter,
    scan,
    scan_plain,
    seek_value_holding,
)
from cherami.wire.keys import MAX_SEQ, plain_key, seq_of, timer_key
from cherami.wire.store import PLAIN, TIMER, ExtentInfo, array_header, unpack_records

_META_CF = "__meta__"
_SHARED_CF = "__extents__"  # every extent's records, under its prefix
_FORMAT_KEY = b"\x00format"  # in the meta column family; extent names never start with NUL
_FORMAT = b"2"  # 2: plain extents hold one value per append
_encoder = msgspec.msgpack.Encoder()  # metadata rows and per-append values
_meta_decoder = msgspec.msgpack.Decoder(tuple[str, int, int, int, bool])
# one append round in the journal: (extent, first seq, records, delivery times) per append
_round_decoder = msgspec.msgpack.Decoder(list[tuple[str, int, list[bytes], list[int] | None]])

log = logging.getLogger("cherami.storage.rocks")


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_background_jobs(2)
    return opts


class RocksExtentStore:
    """An ``ExtentStore`` in one RocksDB directory."""

    def __init__(self, path: str, journal_bytes: int = journal.MAX_BYTES) -> None:
        os.makedirs(path, exist_ok=True)
        self._db = Rdict(path, _options())
        self._sync = WriteOptions()
        self._sync.sync = True
        self._unsynced = WriteOptions()
        self._no_wal = WriteOptions()  # append rounds: the journal makes them durable
        self._no_wal.disable_wal = True  # type: ignore[method-assign,assignment]  # a property (the stub says method)
        # extent -> (column family handle, key prefix) for writes: the shared family and
        # the extent's prefix, or (made before it) the extent's own family and no prefix
        self._cfs: dict[str, tuple[Any, bytes]] = {}
        # column family -> view (for reads), made once: get_column_family() waits for a
        # WAL sync in progress, which would hold every read behind the fsync
        self._views: dict[str, Any] = {}
        self._own: set[str] = set()  # extents kept in a column family of their own
        self._meta: dict[str, ExtentMeta] = {}
        names = set(Rdict.list_cf(path))
        if _META_CF not in names:
            self._db.create_column_family(_META_CF, Options(raw_mode=True))
        self._meta_cf = self._db.get_column_family(_META_CF)
        self._meta_handle = self._db.get_column_family_handle(_META_CF)
        if _SHARED_CF not in names:
            self._db.create_column_family(_SHARED_CF, Options(raw_mode=True))
        self._shared_handle = self._db.get_column_family_handle(_SHARED_CF)
        self._views[_SHARED_CF] = self._db.get_column_family(_SHARED_CF)
        stored_format = self._meta_cf.get(_FORMAT_KEY)
        if stored_format is None:
            if any(True for _ in self._meta_cf.items()):  # extents, and no format key
                self._db.close()
                raise StorageError(
                    "unsupported_format",
                    f"{path} was written by an older version (one value per message); "
                    "drain it with that version or start with a fresh data directory",
                )
            self._meta_cf.put(_FORMAT_KEY, _FORMAT, self._sync)
        elif stored_format != _FORMAT:
            self._db.close()
            raise StorageError("unsupported_format", f"{path}: unknown format {stored_format!r}")
        for key, value in self._meta_cf.items():
            if key == _FORMAT_KEY:
                continue
            extent = cast(bytes, key).decode()
            self._meta[extent] = ExtentMeta(*_meta_decoder.decode(value))
            if extent in names:
                self._own.add(extent)
                self._cfs[extent] = (self._db.get_column_family_handle(extent), b"")
            else:
                self._cfs[extent] = (self._shared_handle, extent_prefix(extent))
        journal_dir = os.path.join(path, "journal")
        self._replay(journal_dir)
        self._journal = journal.Journal(journal_dir, journal_bytes)
        self._journal_bytes = journal_bytes
        self._retiring: threading.Thread | None = None
        # dropped extents' key ranges, compacted away in a thread (space comes back then)
        self._to_compact: list[tuple[bytes, bytes]] = []
        self._compactor: threading.Thread | None = None
        self._compact_lock = threading.Lock()
        self._closing = False

    def _replay(self, directory: str) -> None:
        """Apply the journal's append rounds again over what RocksDB recovered, then make
        them durable through the WAL and remove the journal files.

        RocksDB keeps what it flushed and what went through its WAL (creates, seals,
        drops); appends that were still in memtables are gone, and any column family may
        have been flushed without the others. So every journaled record is put again
        (the same key and value: a no-op where it survived), skipping extents dropped
        since and, for sealed ones, records past the seal (a seal may have cut some
        off); an open extent's metadata moves forward only past what it already says."""
        if not os.path.isdir(directory):
            return
        numbers = journal.numbers(directory)
        rounds = 0
        for number in numbers:
            for payload in journal.records(journal.path(directory, number)):
                try:
                    ops = _round_decoder.decode(payload)
                except msgspec.DecodeError as err:  # its checksum held: not a torn write
                    log.error("journal file %d: a round does not decode (%s); the rest of "
                              "the file is not replayed", number, err)  # fmt: skip
                    break
                self._replay_round(ops)
                rounds += 1
        if numbers:
            self._db.flush_wal(True)
            for number in numbers:
                os.unlink(journal.path(directory, number))
            log.info("replayed %d journaled append rounds from %d file(s)", rounds, len(numbers))

    def _replay_round(self, ops: list[tuple[str, int, list[bytes], list[int] | None]]) -> None:
        batch = WriteBatch(raw_mode=True)
        touched: dict[str, ExtentMeta] = {}
        for extent, first, records, due in ops:
            meta = touched.get(extent) or self._meta.get(extent)
            if meta is None:
                continue  # dropped since
            if meta.sealed:
                keep = meta.last_seq - first + 1
                if keep <= 0:
                    continue
                records, due = records[:keep], (due[:keep] if due is not None else None)
            op = AppendOp(extent, first, records, due)
            self._put_records(batch, *self._cfs[extent], meta.kind, op)
            last = first + len(records) - 1
            if not meta.sealed and last > meta.last_seq:
                meta = touched.setdefault(extent, replace(meta))
                new = records[max(meta.last_seq + 1 - first, 0) :]
                meta.count += len(new)
                meta.bytes += sum(map(len, new))
                meta.last_seq = last
        for extent, meta in touched.items():
            batch.put(extent.encode(), self._encode_meta(meta), self._meta_handle)
        self._db.write(batch, self._unsynced)  # synced once at the end of the replay
        self._meta.update(touched)

    def _encode_meta(self, meta: ExtentMeta) -> bytes:
        return _encoder.encode((meta.kind, meta.last_seq, meta.count, meta.bytes, meta.sealed))

    def _write_meta(self, extent: str, meta: ExtentMeta) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(extent.encode(), self._encode_meta(meta), self._meta_handle)
        self._durable_write(batch)

    def _iter(self, extent: str) -> Any:
        """An iterator over the extent's records, keyed as the extent keys them."""
        if extent in self._own:
            view = self._views.get(extent)
            if view is None:
                view = self._views[extent] = self._db.get_column_family(extent)
            return view.iter()
        return prefixed_iter(self._views[_SHARED_CF], extent)

    def _durable_write(self, batch: WriteBatch) -> None:
        """Write, then fsync the WAL: as durable as a ``sync=True`` write, but rocksdict
        holds the GIL through a synced write's fsync, stalling the store host's event
        loop (and with it every read and reply) for the whole fsync; ``flush_wal(True)``
        syncs with the GIL released. Nothing is acked before it
        returns."""
        self._db.write(batch, self._unsynced)
        self._db.flush_wal(True)

    def create_extent(self, extent: str, kind: str) -> None:
        if kind not in (PLAIN, TIMER):
            raise StorageError("invalid_request", f"unknown extent kind {kind!r}")
        if extent in self._meta:
            return
        prefix = extent_prefix(extent)
        meta = ExtentMeta(kind)
        self._write_meta(extent, meta)
        self._cfs[extent] = (self._shared_handle, prefix)
        self._meta[extent] = meta

    def append(self, ops: list[AppendOp]) -> list[int | StorageError]:
        batch = WriteBatch(raw_mode=True)
        results: list[int | StorageError] = []
        touched: dict[str, ExtentMeta] = {}
        journaled: list[tuple[str, int, list[bytes] | msgspec.Raw, list[int] | None]] = []
        for op in ops:
            meta = touched.get(op.extent) or self._meta.get(op.extent)
            try:
                new = check_append(meta, op)
            except StorageError as err:
                results.append(err)
                continue
            assert meta is not None
            if new:
                if op.extent not in touched:
                    touched[op.extent] = replace(meta)
                meta = touched[op.extent]
                self._put_records(batch, *self._cfs[op.extent], meta.kind, op)
                records = op.records if op.packed is None else msgspec.Raw(op.packed)
                journaled.append((op.extent, op.first_seq, records, op.delivery_ms))
                meta.last_seq = op.first_seq + new - 1
                meta.count += new
                meta.bytes += op.size
            results.append(meta.last_seq)
        if touched:
            for extent, meta in touched.items():
                batch.put(extent.encode(), self._encode_meta(meta), self._meta_handle)
            self._journal.write(_round_parts(journaled))  # durable from here
            try:
                self._db.write(batch, self._no_wal)
            except Exception as err:  # refused, yet journaled: replayed after a restart
                self._journal.broken = f"the RocksDB write after the journal failed: {err}"
                raise
            self._meta.update(touched)
            if self._journal.full():
                try:
                    self._begin_next_journal()
                except OSError:  # the round stands; the next one tries again
                    log.exception("could not begin a new journal file")
        return results

    def _begin_next_journal(self) -> None:
        """Start a new journal file; the older ones go once RocksDB has flushed every
        column family (in a thread: a flush releases the GIL, and appends go on)."""
        older = self._journal.begin_next()
        if self._retiring is not None and self._retiring.is_alive():
            return  # the next rotation retires these too
        self._retiring = threading.Thread(
            target=self._retire, args=(older,), name="cherami-journal-retire", daemon=True
        )
        self._retiring.start()

    def _retire(self, numbers: list[int]) -> None:
        try:
            self._meta_cf.flush(True)
            self._views[_SHARED_CF].flush(True)
            for extent in list(self._own):
                if extent not in self._cfs:
                    continue  # dropped meanwhile
                try:  # a view of its own, not cached: a drop meanwhile must not keep it
                    self._db.get_column_family(extent).flush(True)
                except Exception:
                    if extent in self._meta:  # not dropped meanwhile: keep the journal
                        raise
        except Exception:  # the next new file retires them with its own
            log.exception("flush before retiring journal files %s failed: kept", numbers)
            return
        self._journal.remove(numbers)

    @staticmethod
    def _put_records(batch: WriteBatch, cf: Any, prefix: bytes, kind: str, op: AppendOp) -> None:
        if kind == TIMER:
            assert op.delivery_ms is not None
            seq = op.first_seq
            for due, record in zip(op.delivery_ms, op.unpacked(), strict=True):
                batch.put(prefix + timer_key(due, seq), record, cf)
                seq += 1
        else:  # one value per append: the records array as packed
            value = _encoder.encode(op.records) if op.packed is None else op.packed
            batch.put(prefix + plain_key(op.first_seq), value, cf)

    def read(
        self,
        extent: str,
        after: bytes,
        max_count: int,
        until_ms: int = 0,
        max_bytes: int = 1 << 20,
        max_seq: int = -1,
    ) -> ReadBatch:
        meta = self._require(extent)
        it = self._iter(extent)
        try:
            if meta.kind == PLAIN:
                return scan_plain(it, meta, after, max_count, max_bytes, max_seq)
            return scan(it, meta, after, max_count, until_ms, max_bytes, max_seq)
        finally:
            del it

    def seal(self, extent: str, at_seq: int = -1) -> int:
        meta = self._require(extent)
        if meta.sealed and not 0 <= at_seq < meta.last_seq:
            return meta.last_seq
        meta = replace(meta, sealed=True)
        batch = WriteBatch(raw_mode=True)
        if 0 <= at_seq < meta.last_seq:
            self._truncate(batch, extent, meta, at_seq)
        # the records and the metadata that describes them change in one synced write
        batch.put(extent.encode(), self._encode_meta(meta), self._meta_handle)
        self._durable_write(batch)
        self._meta[extent] = meta
        return meta.last_seq

    def _truncate(self, batch: WriteBatch, extent: str, meta: ExtentMeta, at_seq: int) -> None:
        handle, prefix = self._cfs[extent]
        removed = dropped_bytes = 0
        it = self._iter(extent)
        if meta.kind == PLAIN:
            seek_value_holding(it, at_seq + 1)
            while it.valid():
                first = seq_of(it.key())
                records = unpack_records(it.value())
                keep = max(at_seq + 1 - first, 0)
                if keep < len(records):
                    cut = records[keep:]
                    removed += len(cut)
                    dropped_bytes += sum(map(len, cut))
                    if keep:  # the value straddles the seal point: keep its head
                        batch.put(prefix + it.key(), _encoder.encode(records[:keep]), handle)
                it.next()
            batch.delete_range(prefix + plain_key(at_seq + 1), prefix + plain_key(MAX_SEQ), handle)
        else:
            it.seek_to_first()
            while it.valid():
                key = it.key()
                if seq_of(key) > at_seq:
                    batch.delete(prefix + key, handle)
                    removed += 1
                    dropped_bytes += len(it.value())
                it.next()
        del it
        meta.last_seq = at_seq
        meta.count -= removed
        meta.bytes -= dropped_bytes

    def info(self, extent: str) -> ExtentInfo:
        meta = self._meta.get(extent)
        if meta is None:
            return ExtentInfo(extent, PLAIN, 0, 0, 0, False, exists=False)
        return meta.as_info(extent)

    def extents(self) -> list[str]:
        return sorted(self._meta)

    def drop(self, extent: str) -> None:
        if extent not in self._meta:
            return
        batch = WriteBatch(raw_mode=True)
        batch.delete(extent.encode(), self._meta_handle)
        handle, prefix = self._cfs[extent]
        if prefix:  # its records go with the metadata row, in one synced write
            batch.delete_range(prefix, after_prefix(prefix), handle)
        self._durable_write(batch)
        if prefix:
            self._compact_later(prefix, after_prefix(prefix))
        del self._meta[extent]
        del self._cfs[extent]
        if extent in self._own:
            self._own.discard(extent)
            self._views.pop(extent, None)
            self._db.drop_column_family(extent)

    def _compact_later(self, lo: bytes, hi: bytes) -> None:
        """Compact a dropped extent's range in the compactor thread, so its files' space
        comes back soon instead of at RocksDB's next compaction of them."""
        with self._compact_lock:
            self._to_compact.append((lo, hi))
            if self._compactor is None:
                self._compactor = threading.Thread(
                    target=self._compact, name="cherami-compact", daemon=True
                )
                self._compactor.start()

    def _compact(self) -> None:
        while True:
            with self._compact_lock:
                if not self._to_compact or self._closing:
                    self._compactor = None
                    return
                lo, hi = self._to_compact.pop(0)
            try:
                self._views[_SHARED_CF].compact_range(lo, hi)
            except Exception:
                log.exception("compacting a dropped extent's range failed")

    def _require(self, extent: str) -> ExtentMeta:
        meta = self._meta.get(extent)
        if meta is None:
            raise StorageError("extent_not_found", f"no extent {extent}")
        return meta

    def unflushed_bytes(self) -> int:
        return self._journal.unflushed_bytes

    def limit_unflushed(self, max_bytes: int) -> None:
        """A journal file ends (and the older ones are flushed and removed) past this
        size, between 1 MiB and the configured journal_bytes: on a small or nearly
        full disk, what a flush writes again stays a small part of the free space."""
        self._journal.max_bytes = max(1 << 20, min(self._journal_bytes, max_bytes))

    def close(self) -> None:
        """Flush every column family and remove the journal (a clean stop leaves no
        journal to replay), then close RocksDB."""
        if self._retiring is not None:
            self._retiring.join()
        with self._compact_lock:
            self._closing = True
            compactor = self._compactor
        if compactor is not None:
            compactor.join()
        self._journal.close()
        self._retire(self._journal.numbers())
        self._cfs.clear()
        self._views.clear()
        del self._meta_cf, self._meta_handle, self._shared_handle
        self._db.close()


def _round_parts(
    journaled: list[tuple[str, int, list[bytes] | msgspec.Raw, list[int] | None]],
) -> list[bytes]:
    """A round as the journal keeps it, ``_encoder.encode(journaled)``, in parts: a
    packed records array is written as it is instead of copied (msgpack concatenates)."""
    parts = [array_header(len(journaled))]
    for extent, first_seq, records, delivery_ms in journaled:
        if isinstance(records, msgspec.Raw):
            head = _encoder.encode((extent, first_seq))
            parts += [array_header(4) + head[1:], records, _encoder.encode(delivery_ms)]
        else:
            parts.append(_encoder.encode((extent, first_seq, records, delivery_ms)))
    return parts
