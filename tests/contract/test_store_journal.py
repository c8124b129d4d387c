"""The RocksDB store's append journal (storage/journal.py): appends are durable through
it, not RocksDB's WAL. Each test writes in a child process that then dies without
closing anything (os._exit: memtables are lost, as in a SIGKILL), and reopens the store
in this process."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
from pathlib import Path

from cherami.storage import journal
from cherami.storage.base import AppendOp
from cherami.storage.rocks import RocksExtentStore
from cherami.wire.keys import plain_key
from cherami.wire.store import PLAIN, TIMER, pack_records


def _records(n: int, start: int = 1, size: int = 40) -> list[bytes]:
    return [f"r{i}".encode().ljust(size, b".") for i in range(start, start + n)]


def _packed(extent: str, first_seq: int, records: list[bytes]) -> AppendOp:
    """The op as a store host makes it from an input host's packed append."""
    return AppendOp.of_packed(
        extent, first_seq, bytes(pack_records(records)), sum(map(len, records))
    )


def _die_after(work: str, path: str, journal_bytes: int) -> None:
    store = RocksExtentStore(path, journal_bytes=journal_bytes)
    if work == "appends":
        store.create_extent("e1", PLAIN)
        store.create_extent("t1", TIMER)
        first = 1
        for n in (3, 5, 2, 7):  # four rounds, the plain appends packed in two of them
            store.append([
                _packed("e1", first, _records(n, first)) if n % 2 else
                AppendOp("e1", first, _records(n, first)),
                AppendOp("t1", first, _records(n, first), [100 + i for i in range(n)]),
            ])  # fmt: skip
            first += n
    elif work == "seal_drop":
        for name in ("cut", "whole", "gone"):
            store.create_extent(name, PLAIN)
        for first, n in ((1, 4), (5, 4), (9, 4)):
            store.append([AppendOp(e, first, _records(n, first)) for e in ("cut", "whole", "gone")])
        store.seal("cut", at_seq=6)  # through the WAL, after appends that were not
        store.seal("whole")
        store.drop("gone")
    elif work == "file_limit":
        # a real short write, then EFBIG: the file may not grow past a limit (RLIMIT_FSIZE)
        store.create_extent("e1", PLAIN)
        store.append([AppendOp("e1", 1, _records(10))])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = store._journal.size + 1000
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        try:  # ~2,100 B: 1,000 of them written, then the round is refused
            store.append([AppendOp("e1", 11, _records(50, 11))])
        except OSError:
            pass
        else:
            raise AssertionError("a round that did not reach the journal was not refused")
        assert store._journal.size == os.path.getsize(store._journal.path(1)) < limit
        assert store.append([AppendOp("e1", 11, _records(5, 11))]) == [15]  # fits
    elif work == "rotations":
        store.create_extent("e1", PLAIN)
        for i in range(200):
            store.append([AppendOp("e1", 1 + i * 10, _records(10, 1 + i * 10, size=200))])
        if store._retiring is not None:
            store._retiring.join()  # some files retired (their data flushed), others not
        for i in range(200, 205):  # and these only in the journal
            store.append([AppendOp("e1", 1 + i * 10, _records(10, 1 + i * 10, size=200))])
    os._exit(0)


def _crash(work: str, path: str, journal_bytes: int = journal.MAX_BYTES) -> None:
    proc = mp.get_context("spawn").Process(target=_die_after, args=(work, path, journal_bytes))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def _reopened_after(
    work: str, tmp_path: Path, journal_bytes: int = journal.MAX_BYTES
) -> RocksExtentStore:
    """The store reopened in this process after ``work`` in a child that died."""
    path = str(tmp_path / "db")
    _crash(work, path, journal_bytes)
    return RocksExtentStore(path)


def _holds(store: RocksExtentStore, extent: str, n: int) -> None:
    """``extent`` holds records 1..n, and its metadata says so."""
    info = store.info(extent)
    assert (info.last_seq, info.count) == (n, n)
    assert store.read(extent, b"", 100).records == _records(n)


def test_appends_survive_a_crash_before_any_flush(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _crash("appends", path)
    assert os.listdir(os.path.join(path, "journal")) == ["1.log"]
    store = RocksExtentStore(path)
    info = store.info("e1")
    assert (info.last_seq, info.count, info.bytes) == (17, 17, sum(map(len, _records(17))))
    assert store.read("e1", b"", 100).records == _records(17)
    assert store.read("e1", plain_key(9), 3).records == _records(3, 10)
    timer = store.read("t1", b"", 100, until_ms=10_000)
    assert sorted(timer.records) == sorted(_records(17)) and store.info("t1").count == 17
    # the replay went through the WAL and the journal files are gone
    assert os.listdir(os.path.join(path, "journal")) == ["1.log"]  # the new, empty one
    assert os.path.getsize(os.path.join(path, "journal", "1.log")) == 0
    store.append([AppendOp("e1", 18, _records(1, 18))])
    store.close()
    assert os.listdir(os.path.join(path, "journal")) == []  # a clean close leaves none
    again = RocksExtentStore(path)
    assert again.read("e1", b"", 100).records == _records(18)
    again.close()


def test_seals_and_drops_after_unflushed_appends(tmp_path: Path) -> None:
    store = _reopened_after("seal_drop", tmp_path)
    _holds(store, "cut", 6)  # not the cut-off 7-12
    _holds(store, "whole", 12)
    assert store.info("cut").sealed and store.info("whole").sealed
    assert store.info("gone").exists is False and store.extents() == ["cut", "whole"]
    store.close()


def test_retired_files_and_the_rest_add_up_after_a_crash(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _crash("rotations", path, journal_bytes=20_000)  # a new file every ~10 rounds
    left = os.listdir(os.path.join(path, "journal"))
    assert 1 <= len(left) < 20  # most files were retired once flushed
    store = RocksExtentStore(path)
    assert store.info("e1").count == 2050
    assert store.read("e1", b"", 5000, max_bytes=1 << 30).records == _records(2050, size=200)
    store.close()


def test_a_torn_last_record_is_not_replayed(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _crash("appends", path)
    log = os.path.join(path, "journal", "1.log")
    whole = Path(log).read_bytes()
    Path(log).write_bytes(whole[:-10])  # the last round's write was cut short: never acked
    store = RocksExtentStore(path)
    assert store.info("e1").last_seq == 10  # the first three rounds
    assert store.read("e1", b"", 100).records == _records(10)
    assert list(journal.records(log)) == []  # replayed and removed; the new file is empty
    store.close()


def test_a_zero_filled_tail_ends_the_journal(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _crash("appends", path)
    with open(os.path.join(path, "journal", "1.log"), "ab") as fh:
        fh.write(bytes(64))  # an OS crash can leave the end of a file zero-filled
    store = RocksExtentStore(path)
    assert store.read("e1", b"", 100).records == _records(17)
    store.close()


def test_a_write_that_fails_is_cut_off_and_later_rounds_survive(tmp_path: Path) -> None:
    store = _reopened_after("file_limit", tmp_path)
    _holds(store, "e1", 15)  # the refused round is not replayed
    store.close()
