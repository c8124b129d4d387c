"""The RocksDB store's layout: every extent in one column family under its prefix, and
the extents an older version kept in a column family each still served, sealed and
dropped as before, side by side with new ones, across a reopen."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from rocksdict import Options, Rdict, WriteOptions

from cherami.storage.base import AppendOp
from cherami.storage.rocks import RocksExtentStore
from cherami.wire.keys import plain_key, seq_of, timer_key
from cherami.wire.store import PLAIN, TIMER

_encode = msgspec.msgpack.Encoder().encode


def _old_layout(path: Path) -> None:
    """A data dir as the column-family-per-extent version wrote it (format 2): a plain
    extent "old1" holding one append of two records, a timer extent "old2" of one."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    db = Rdict(str(path), opts)
    sync = WriteOptions()
    sync.sync = True
    meta = db.create_column_family("__meta__", Options(raw_mode=True))
    meta.put(b"\x00format", b"2", sync)
    old1 = db.create_column_family("old1", Options(raw_mode=True))
    old1.put(plain_key(1), _encode([b"a", b"b"]), sync)
    meta.put(b"old1", _encode((PLAIN, 2, 2, 2, False)), sync)
    old2 = db.create_column_family("old2", Options(raw_mode=True))
    old2.put(timer_key(5, 1), b"t", sync)
    meta.put(b"old2", _encode((TIMER, 1, 1, 1, False)), sync)
    db.close()


def _texts(store: RocksExtentStore, extent: str) -> list[bytes]:
    return store.read(extent, b"", 100).records


def test_old_extents_are_served_beside_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _old_layout(path)
    store = RocksExtentStore(str(path))
    assert _texts(store, "old1") == [b"a", b"b"]
    assert _texts(store, "old2") == [b"t"]
    assert store.append([AppendOp("old1", 3, [b"c", b"d"])]) == [4]
    store.create_extent("new1", PLAIN)
    store.create_extent("new2", TIMER)
    assert store.append([AppendOp("new1", 1, [b"x", b"y"]), AppendOp("new2", 1, [b"z"], [9])])
    assert store.seal("old1", 3) == 3  # cut back inside its own column family
    assert _texts(store, "old1") == [b"a", b"b", b"c"]
    store.drop("old2")
    assert "old2" not in Rdict.list_cf(str(path))
    store.close()

    store = RocksExtentStore(str(path))
    assert store.extents() == ["new1", "new2", "old1"]
    assert _texts(store, "old1") == [b"a", b"b", b"c"]
    assert _texts(store, "new1") == [b"x", b"y"]
    assert [seq_of(k) for k in store.read("new2", b"", 10).keys] == [1]
    assert not store.info("old2").exists
    store.close()


def test_neighbouring_extents_never_see_each_others_records(tmp_path: Path) -> None:
    """Names that are prefixes of each other, a seal that cuts back, and a drop: each
    extent reads only its own records, and a dropped one's records are gone."""
    store = RocksExtentStore(str(tmp_path / "store"))
    for name in ("a", "ab", "b"):
        store.create_extent(name, PLAIN)
    store.create_extent("t", TIMER)
    store.create_extent("u", TIMER)
    store.append([
        AppendOp("a", 1, [b"a1", b"a2", b"a3"]), AppendOp("ab", 1, [b"ab1"]),
        AppendOp("b", 1, [b"b1", b"b2"]),
        AppendOp("t", 1, [b"t1", b"t2"], [20, 10]), AppendOp("u", 1, [b"u1"], [15]),
    ])  # fmt: skip
    assert _texts(store, "a") == [b"a1", b"a2", b"a3"]
    assert _texts(store, "ab") == [b"ab1"]
    assert store.read("a", plain_key(3), 10).records == []  # past its end: not ab's
    assert _texts(store, "t") == [b"t2", b"t1"]  # delivery order
    assert store.read("t", b"", 10, until_ms=12).records == [b"t2"]
    assert store.seal("a", 1) == 1
    assert _texts(store, "a") == [b"a1"] and _texts(store, "ab") == [b"ab1"]
    assert store.seal("t", 1) == 1  # the timer record of seq 2 goes, u keeps its own
    assert _texts(store, "t") == [b"t1"] and _texts(store, "u") == [b"u1"]
    store.drop("ab")
    assert _texts(store, "a") == [b"a1"] and _texts(store, "b") == [b"b1", b"b2"]
    store.create_extent("ab", PLAIN)  # the same name again: nothing of the old one
    assert _texts(store, "ab") == []
    store.close()


def test_a_dropped_extents_space_comes_back(tmp_path: Path) -> None:
    store = RocksExtentStore(str(tmp_path / "store"))
    store.create_extent("big", PLAIN)
    store.create_extent("kept", PLAIN)
    for i in range(20):  # 20 MB that do not compress, flushed to files
        store.append([AppendOp("big", i * 1000 + 1, [os.urandom(1000) for _ in range(1000)])])
    store.append([AppendOp("kept", 1, [b"k"])])
    view = store._views["__extents__"]
    view.flush(True)
    before = view.property_int_value("rocksdb.total-sst-files-size")
    assert before > 10_000_000
    store.drop("big")
    with store._compact_lock:
        compactor = store._compactor
    if compactor is not None:
        compactor.join(30)
    after = view.property_int_value("rocksdb.total-sst-files-size")
    assert after < before / 10, (before, after)
    assert _texts(store, "kept") == [b"k"]
    store.close()
