"""One contract for every ExtentStore implementation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cherami.storage.base import AppendOp, ExtentStore, StorageError
from cherami.storage.memory import MemoryExtentStore
from cherami.storage.rocks import RocksExtentStore
from cherami.wire.keys import plain_key, seq_of
from cherami.wire.store import PLAIN, TIMER, pack_records


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ExtentStore]:
    impl: ExtentStore = (
        MemoryExtentStore() if request.param == "memory" else RocksExtentStore(str(tmp_path / "db"))
    )
    yield impl
    impl.close()


def _records(n: int, start: int = 1) -> list[bytes]:
    return [f"m{i}".encode() for i in range(start, start + n)]


def _packed(extent: str, first_seq: int, records: list[bytes]) -> AppendOp:
    """The op as a store host makes it from an input host's packed append."""
    return AppendOp.of_packed(
        extent, first_seq, bytes(pack_records(records)), sum(map(len, records))
    )


def test_packed_appends_store_the_same_records(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    big = [bytes([i % 256]) * (i * 7) for i in range(1, 40)]  # bin8 and bin16 framing
    ops = [_packed("e1", 1, _records(3)), AppendOp("e1", 4, big), _packed("e1", 43, big)]
    assert store.append(ops) == [3, 42, 81]
    assert store.append([_packed("e1", 4, big)]) == [81]  # a repeat: nothing new
    (gap,) = store.append([_packed("e1", 90, _records(2))])
    assert isinstance(gap, StorageError) and gap.code == "sequence_gap"
    batch = store.read("e1", b"", 1000, max_bytes=1 << 30)
    assert batch.records == _records(3) + big + big
    assert [seq_of(k) for k in batch.keys] == list(range(1, 82))
    info = store.info("e1")
    assert (info.count, info.bytes) == (81, sum(map(len, _records(3) + big + big)))
    assert store.read("e1", plain_key(43), 2).records == big[1:3]  # inside a packed one
    assert store.seal("e1", at_seq=50) == 50
    assert store.read("e1", plain_key(45), 100).records == big[3:8]


def test_append_then_read_in_order(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    assert store.append([AppendOp("e1", 1, _records(3)), AppendOp("e1", 4, _records(2, 4))]) == [
        3,
        5,
    ]
    batch = store.read("e1", b"", 10)
    assert [seq_of(k) for k in batch.keys] == [1, 2, 3, 4, 5]
    assert batch.records == _records(5)
    assert batch.end is False


def test_read_from_any_sequence_number_and_limits(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    store.append([AppendOp("e1", 1, _records(100))])
    batch = store.read("e1", plain_key(41), 5)
    assert [seq_of(k) for k in batch.keys] == [42, 43, 44, 45, 46]
    assert store.read("e1", plain_key(100), 5).keys == []
    assert len(store.read("e1", b"", 100, max_bytes=10).keys) == 5  # stops once 10 bytes are in


def test_gap_unknown_and_repeat(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    store.append([AppendOp("e1", 1, _records(2))])
    gap, unknown, repeat = store.append(
        [
            AppendOp("e1", 5, _records(1)),
            AppendOp("nope", 1, _records(1)),
            AppendOp("e1", 1, _records(2)),
        ]
    )
    assert isinstance(gap, StorageError) and gap.code == "sequence_gap"
    assert isinstance(unknown, StorageError) and unknown.code == "extent_not_found"
    assert repeat == 2
    assert store.info("e1").count == 2


def test_seal_refuses_appends_and_marks_end(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    store.append([AppendOp("e1", 1, _records(3))])
    assert store.seal("e1") == 3
    (refused,) = store.append([AppendOp("e1", 4, _records(1))])
    assert isinstance(refused, StorageError) and refused.code == "extent_sealed"
    batch = store.read("e1", b"", 10)
    assert len(batch.keys) == 3 and batch.end is True
    assert store.info("e1").sealed is True


def test_seal_at_sequence_truncates(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    store.append([AppendOp("e1", 1, _records(10))])
    assert store.seal("e1", at_seq=6) == 6
    info = store.info("e1")
    assert (info.last_seq, info.count) == (6, 6)
    assert [seq_of(k) for k in store.read("e1", b"", 100).keys] == [1, 2, 3, 4, 5, 6]


def test_timer_extent_reads_in_delivery_order_up_to_a_time(store: ExtentStore) -> None:
    store.create_extent("t1", TIMER)
    store.append([AppendOp("t1", 1, [b"late", b"early", b"middle"], [3000, 1000, 2000])])
    batch = store.read("t1", b"", 10, until_ms=2500)
    assert batch.records == [b"early", b"middle"]
    rest = store.read("t1", batch.keys[-1], 10, until_ms=5000)
    assert rest.records == [b"late"] and [seq_of(k) for k in rest.keys] == [1]


def test_drop_and_info(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    store.create_extent("e2", TIMER)
    store.append([AppendOp("e1", 1, _records(4))])
    assert store.info("e1").bytes == sum(map(len, _records(4)))
    assert store.extents() == ["e1", "e2"]
    store.drop("e1")
    assert store.extents() == ["e2"]
    assert store.info("e1").exists is False
    with pytest.raises(StorageError):
        store.read("e1", b"", 1)


def test_rocks_survives_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = RocksExtentStore(path)
    store.create_extent("e1", PLAIN)
    store.create_extent("t1", TIMER)
    store.append([AppendOp("e1", 1, _records(5)), AppendOp("t1", 1, [b"x"], [10])])
    store.seal("t1")
    store.close()
    again = RocksExtentStore(path)
    assert again.info("e1").last_seq == 5
    assert again.info("t1").sealed is True
    assert again.read("e1", plain_key(3), 10).records == _records(2, 4)
    again.append([AppendOp("e1", 6, _records(1, 6))])
    assert again.info("e1").count == 6
    again.close()


def test_read_stops_at_max_seq(store: ExtentStore) -> None:
    store.create_extent("e1", PLAIN)
    store.create_extent("t1", TIMER)
    store.append([AppendOp("e1", 1, _records(10)), AppendOp("t1", 1, [b"a", b"b"], [5, 1])])
    assert [seq_of(k) for k in store.read("e1", b"", 100, max_seq=4).keys] == [1, 2, 3, 4]
    assert store.read("e1", b"", 100, max_seq=0).keys == []
    # timer extents stop at the first record past max_seq, never skipping it
    assert store.read("t1", b"", 100, until_ms=10, max_seq=1).records == []
    assert store.read("t1", b"", 100, until_ms=10, max_seq=2).records == [b"b", b"a"]


def _appended_in_parts(store: ExtentStore, sizes: list[int]) -> list[bytes]:
    """Append ``sizes`` records at a time (the RocksDB store keeps one value per append)."""
    store.create_extent("e1", PLAIN)
    first = 1
    for n in sizes:
        assert store.append([AppendOp("e1", first, _records(n, first))]) == [first + n - 1]
        first += n
    return _records(first - 1)


def test_reads_cross_append_boundaries_from_any_point(store: ExtentStore) -> None:
    everything = _appended_in_parts(store, [3, 1, 5, 2])  # seqs 1-3 | 4 | 5-9 | 10-11
    for after in range(0, 12):
        for count in (1, 2, 4, 20):
            batch = store.read("e1", plain_key(after) if after else b"", count)
            want = list(range(after + 1, min(after + count, 11) + 1))
            assert [seq_of(k) for k in batch.keys] == want, (after, count)
            assert batch.records == everything[after : after + len(want)]
    # walking the extent with small reads returns every record once, in order
    seen: list[bytes] = []
    after_key = b""
    while True:
        batch = store.read("e1", after_key, 3, max_seq=9)
        if not batch.keys:
            break
        seen.extend(batch.records)
        after_key = batch.keys[-1]
    assert seen == everything[:9]


def test_seal_inside_an_append_keeps_its_head(store: ExtentStore) -> None:
    everything = _appended_in_parts(store, [4, 4, 4])
    assert store.seal("e1", at_seq=6) == 6
    info = store.info("e1")
    assert (info.last_seq, info.count, info.bytes) == (6, 6, sum(map(len, everything[:6])))
    batch = store.read("e1", plain_key(2), 100)
    assert batch.records == everything[2:6] and batch.end is True
    assert store.read("e1", plain_key(6), 100).end is True


def test_rocks_keeps_truncation_across_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = RocksExtentStore(path)
    everything = _appended_in_parts(store, [5, 5])
    store.seal("e1", at_seq=3)
    store.close()
    again = RocksExtentStore(path)
    assert again.read("e1", b"", 100).records == everything[:3]
    assert again.info("e1").count == 3
    again.close()


def test_rocks_refuses_a_directory_of_the_older_format(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    path = str(tmp_path / "db")
    old = Rdict(path, Options(raw_mode=True))
    old.create_column_family("__meta__", Options(raw_mode=True))
    old.get_column_family("__meta__").put(b"e1", b"\x95\xa5plain\x01\x01\x01\xc2")
    old.close()
    with pytest.raises(StorageError) as refused:
        RocksExtentStore(path)
    assert refused.value.code == "unsupported_format"


def test_a_sealed_extent_is_only_ever_cut_back(store: ExtentStore) -> None:
    everything = _appended_in_parts(store, [5, 5])
    assert store.seal("e1") == 10  # sealed where it stands: appends stop
    assert store.seal("e1", at_seq=12) == 10  # never extended
    assert store.seal("e1", at_seq=7) == 7  # cut back to what every replica holds
    assert store.seal("e1", at_seq=-1) == 7
    info = store.info("e1")
    assert (info.last_seq, info.count, info.sealed) == (7, 7, True)
    assert store.read("e1", b"", 100).records == everything[:7]
