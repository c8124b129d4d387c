"""A store host's own write-ahead journal of append rounds.

RocksDB's WAL checksums every byte it logs with a CRC32C that the portable ``rocksdict``
build computes without the CPU's CRC instruction (~1.1 GB/s here): more than half of a
145 KB synced write's CPU went into it (benchmarks/README.md). Append rounds therefore
go to RocksDB's memtables *without* its WAL and to this journal instead: one record per
round, ``u32 length | u32 CRC-32C of length and payload | payload``, written and
``fdatasync``ed before the round is acked. Everything else (creates, seals, drops)
still goes through the WAL. The CRC-32C comes from google-crc32c, which uses the CPU's
CRC instruction (~27 GB/s here, zlib.crc32 ~4-7 GB/s). A round's payload is written in
parts (``write(parts)``): the records arrays are not copied into one buffer first.

Files are ``journal/<n>.log`` in the store's directory. When the current file passes
``max_bytes`` a new one is begun (between two rounds), and the older files are removed
once every column family has been flushed to RocksDB's own files (rocks.py). On open,
whatever files are left are replayed in order; a record cut short, of length 0 (a
zero-filled tail) or failing its checksum ends a file (it was never acked: the round's
fdatasync had not returned).

A write that fails is cut off again (``ftruncate`` back to where it began, synced), so
later rounds never sit behind a fragment that would end the file early on replay. A
failed sync is not retried: after one, the kernel may have dropped the pages and still
let later syncs succeed, so the journal is ``broken`` and takes no more rounds until
the store host starts again (its appends fail, and their extents are sealed
elsewhere)."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence

import google_crc32c

_HEADER = struct.Struct("<II")  # length, CRC-32C of the length's bytes and the payload
_SIZE = struct.Struct("<I")
MAX_BYTES = 64 << 20  # a new file is begun past this (and the older ones retired)


def numbers(directory: str) -> list[int]:
    """The journal files in ``directory``, oldest first."""
    return sorted(
        int(name[:-4]) for name in os.listdir(directory)
        if name.endswith(".log") and name[:-4].isdigit()
    )  # fmt: skip


def path(directory: str, number: int) -> str:
    return os.path.join(directory, f"{number}.log")


class JournalBroken(OSError):
    """A journal write or sync failed in a way that leaves the journal untrustworthy."""


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    def __init__(self, directory: str, max_bytes: int = MAX_BYTES) -> None:
        if not os.path.isdir(directory):
            os.makedirs(directory)
            _sync_dir(os.path.dirname(os.path.abspath(directory)))
        self.directory = directory
        self.max_bytes = max_bytes
        self.broken: str | None = None  # why it takes no more rounds
        numbers = self.numbers()
        self._number = (numbers[-1] + 1) if numbers else 1
        self._fd = self._open(self._number)
        self.size = os.fstat(self._fd).st_size
        # the bytes of the older files, not removed yet (RocksDB has not flushed them)
        self._older = {n: _size(self.path(n)) for n in numbers}

    @property
    def unflushed_bytes(self) -> int:
        """What the journal holds that RocksDB keeps only in memory: a flush writes it
        again (as table files) before the journal files are removed."""
        return self.size + sum(list(self._older.values()))  # removals run in a thread

    def numbers(self) -> list[int]:
        return numbers(self.directory)

    def path(self, number: int) -> str:
        return path(self.directory, number)

    def _open(self, number: int) -> int:
        fd = os.open(self.path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _sync_dir(self.directory)  # the file's name is durable before anything in it counts
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, parts: Sequence[bytes]) -> None:
        """Append one record, its payload ``parts`` joined, and sync it (the GIL is
        released while it syncs). Raises OSError when it did not become durable;
        JournalBroken from then on if the failure may have left the journal
        untrustworthy."""
        if self.broken is not None:
            raise JournalBroken(f"journal broken since: {self.broken}")
        length = sum(map(len, parts))
        crc = google_crc32c.value(_SIZE.pack(length))
        for part in parts:
            crc = google_crc32c.extend(crc, part)
        header = _HEADER.pack(length, crc)
        try:
            written = os.writev(self._fd, [header, *parts])
            if written != len(header) + length:
                raise OSError(f"journal: short write ({written} of {len(header) + length})")
        except OSError as err:
            self._cut_back(err)
            raise
        try:
            os.fdatasync(self._fd)
        except OSError as err:
            self.broken = f"fdatasync failed: {err}"
            self._cut_back(err)
            raise
        self.size += written

    def _cut_back(self, err: OSError) -> None:
        """Remove what a failed write left past the last whole record."""
        try:
            os.ftruncate(self._fd, self.size)
            os.fdatasync(self._fd)
        except OSError as again:
            self.broken = f"{err}; cutting the record off failed too: {again}"

    def full(self) -> bool:
        return self.size >= self.max_bytes

    def begin_next(self) -> list[int]:
        """Start a new file; returns the numbers of the older ones (to retire once what
        they hold is in RocksDB's files)."""
        older = [n for n in self.numbers() if n <= self._number]
        fd = self._open(self._number + 1)
        os.close(self._fd)
        self._older[self._number] = self.size
        self._number, self._fd, self.size = self._number + 1, fd, 0
        return older

    def remove(self, numbers: list[int]) -> None:
        for number in numbers:
            try:
                os.unlink(self.path(number))
            except FileNotFoundError:
                pass
            self._older.pop(number, None)

    def close(self) -> None:
        os.close(self._fd)


def _size(file: str) -> int:
    try:
        return os.path.getsize(file)
    except FileNotFoundError:
        return 0


def records(path: str) -> Iterator[bytes]:
    """The payloads of one journal file, up to the first one cut short or corrupt."""
    with open(path, "rb") as fh:
        data = fh.read()
    at = 0
    while at + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, at)
        start = at + _HEADER.size
        payload = data[start : start + length]
        if not length or len(payload) != length:
            return  # a zero-filled or cut-short tail
        if google_crc32c.extend(google_crc32c.value(data[at : at + _SIZE.size]), payload) != crc:
            return
        yield payload
        at = start + length
