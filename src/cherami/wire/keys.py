"""Storage keys. Plain extents: the 8-byte big-endian sequence number. Timer extents:
the 8-byte big-endian delivery time (ms) then the sequence number, so that a scan
returns messages in delivery order."""

from __future__ import annotations

import struct

_SEQ = struct.Struct(">Q")
_TIMER = struct.Struct(">QQ")
MAX_SEQ = (1 << 64) - 1


def plain_key(seq: int) -> bytes:
    return _SEQ.pack(seq)


def timer_key(delivery_ms: int, seq: int) -> bytes:
    return _TIMER.pack(delivery_ms, seq)


def seq_of(key: bytes) -> int:
    """The sequence number a key of either kind names."""
    seq: int = _SEQ.unpack_from(key, len(key) - 8)[0]
    return seq


def due_ms_of(key: bytes) -> int:
    """The delivery time of a timer key."""
    due: int = _SEQ.unpack_from(key, 0)[0]
    return due


def plain_keys(first_seq: int, count: int) -> list[bytes]:
    pack = _SEQ.pack
    return [pack(s) for s in range(first_seq, first_seq + count)]
