"""The storage contract of a store host: a set of extent replicas, each an ordered,
append-only map from storage key to record bytes (see ``keys``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cherami.errors import CheramiError
from cherami.wire.store import ExtentInfo, packed_count, unpack_records


@dataclass(frozen=True, slots=True)
class AppendOp:
    """Records to append at ``first_seq`` onwards: either ``records``, or (plain extents)
    ``packed``, the records as one msgpack array of bin exactly as the input host packed
    them for every replica, with their ``packed_count`` and total ``packed_size``. A store
    keeps a packed array as it came, without taking it apart record by record."""

    extent: str
    first_seq: int
    records: list[bytes]
    delivery_ms: list[int] | None = None
    packed: bytes | None = None
    packed_count: int = 0
    packed_size: int = 0

    @classmethod
    def of_packed(cls, extent: str, first_seq: int, packed: bytes, size: int) -> AppendOp:
        """An op of a packed records array; ValueError when its header is not an array's
        or ``size`` cannot be its records' total (``packed_count``)."""
        return cls(extent, first_seq, [], None, packed, packed_count(packed, size), size)

    @property
    def count(self) -> int:
        return self.packed_count if self.packed is not None else len(self.records)

    @property
    def size(self) -> int:
        """The records' bytes (without msgpack framing)."""
        return self.packed_size if self.packed is not None else sum(map(len, self.records))

    def unpacked(self) -> list[bytes]:
        return self.records if self.packed is None else unpack_records(self.packed)


@dataclass(frozen=True, slots=True)
class ReadBatch:
    keys: list[bytes]
    records: list[bytes]
    end: bool  # sealed and nothing after the last key


class StorageError(CheramiError):
    """A refused storage operation; ``code`` is the store protocol's error code
    (docs/protocol.md §7; docs/api.md lists each)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ExtentStore(Protocol):
    def create_extent(self, extent: str, kind: str) -> None:
        """Create an empty open extent; creating an existing one changes nothing."""

    def append(self, ops: list[AppendOp]) -> list[int | StorageError]:
        """Apply every op with one synced write (group commit).

        Returns, per op, the extent's last sequence number after it, or the error that
        refused it (unknown extent, sealed extent, a gap in sequence numbers). Ops that
        repeat sequence numbers already stored are acknowledged without writing again.
        """

    def read(
        self,
        extent: str,
        after: bytes,
        max_count: int,
        until_ms: int = 0,
        max_bytes: int = 1 << 20,
        max_seq: int = -1,
    ) -> ReadBatch:
        """Records after ``after`` in key order: at most ``max_count`` (and about
        ``max_bytes``), for timer extents only those due by ``until_ms``, and none past
        sequence number ``max_seq`` (-1: no limit; reading stops at the first one)."""

    def seal(self, extent: str, at_seq: int = -1) -> int:
        """Refuse further appends; keep records up to ``at_seq`` (< 0: all). Returns the
        sealed last sequence number. An extent sealed already is only cut back further
        (to ``at_seq`` when it holds more): that is how a seal settles on the sequence
        number every replica holds, after each replica first sealed where it stood."""

    def info(self, extent: str) -> ExtentInfo: ...

    def extents(self) -> list[str]: ...

    def drop(self, extent: str) -> None:
        """Delete the extent and all its records."""

    def unflushed_bytes(self) -> int:
        """Bytes the store will write to disk again before it can free them (a journal
        whose records are still only in memory elsewhere): room the disk must keep."""

    def limit_unflushed(self, max_bytes: int) -> None:
        """Keep ``unflushed_bytes`` to about ``max_bytes`` (at most the store's own
        limit): past it, what it holds is flushed and the bytes freed."""

    def close(self) -> None: ...


@dataclass(slots=True)
class ExtentMeta:
    """What a store keeps about one replica besides its records."""

    kind: str
    last_seq: int = 0
    count: int = 0
    bytes: int = 0
    sealed: bool = False

    def as_info(self, extent: str) -> ExtentInfo:
        return ExtentInfo(extent, self.kind, self.last_seq, self.count, self.bytes, self.sealed)


def check_append(meta: ExtentMeta | None, op: AppendOp) -> int:
    """How many of ``op``'s records are new: 0 for a repeat of stored records.

    Raises StorageError when the extent is unknown or sealed, or on a gap.
    """
    if meta is None:
        raise StorageError("extent_not_found", f"no extent {op.extent}")
    count = op.count
    last = op.first_seq + count - 1
    if last <= meta.last_seq:
        return 0
    if meta.sealed:
        raise StorageError("extent_sealed", f"extent {op.extent} is sealed at {meta.last_seq}")
    if op.first_seq != meta.last_seq + 1:
        raise StorageError(
            "sequence_gap",
            f"extent {op.extent} holds {meta.last_seq}, append starts {op.first_seq}",
        )
    if (op.delivery_ms is not None) != (meta.kind == "timer") or (
        op.delivery_ms is not None and len(op.delivery_ms) != count
    ):
        raise StorageError("invalid_request", "timer appends carry one delivery_ms per record")
    return count
