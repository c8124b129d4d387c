"""Length-prefixed frames over asyncio streams: a 4-byte big-endian length, then the body."""

from __future__ import annotations

import asyncio
import struct

from cherami.errors import ProtocolError

MAX_FRAME = 64 << 20
READ_BUFFER = 1 << 20  # larger stream buffers slow the consume path (PERFORMANCE.md)
_HEADER = struct.Struct(">I")


def pack_frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's body; raises ``asyncio.IncompleteReadError`` at end of stream."""
    header = await reader.readexactly(4)
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return await reader.readexactly(size)


def write_frames(writer: asyncio.StreamWriter, bodies: list[bytes]) -> None:
    writer.writelines([pack_frame(b) for b in bodies])
