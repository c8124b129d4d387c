"""Length-prefixed frames over asyncio streams: a 4-byte big-endian length, then the body."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence

from cherami.errors import ProtocolError

MAX_FRAME = 64 << 20
READ_BUFFER = 1 << 20  # larger stream buffers slow the consume path (PERFORMANCE.md)
_HEADER = struct.Struct(">I")
_JOIN_BELOW = 16 << 10  # smaller frames are copied behind their header: fewer buffers


def pack_frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's body; raises ``asyncio.IncompleteReadError`` at end of stream."""
    header = await reader.readexactly(4)
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return await reader.readexactly(size)


class Cork:
    """Frames for one or more streams, written at the end of the event-loop turn: what a
    stream is sent in one turn leaves in one write, in order. A loopback write is a system
    call that wakes the process at the other end; one per turn instead of one per frame
    (docs/protocol.md)."""

    def __init__(self) -> None:
        self._out: dict[asyncio.StreamWriter, list[bytes]] = {}

    def send(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        self.send_parts(writer, (body,))

    def send_parts(self, writer: asyncio.StreamWriter, parts: Sequence[bytes]) -> None:
        """One frame whose body is ``parts`` joined. Large parts are written as they are
        (uvloop writes the turn's buffers with one writev), not copied behind a header."""
        if not self._out:
            asyncio.get_running_loop().call_soon(self.flush)
        out = self._out.get(writer)
        if out is None:
            out = self._out[writer] = []
        size = sum(map(len, parts))
        if size < _JOIN_BELOW:
            out.append(_HEADER.pack(size) + b"".join(parts))
        else:
            out.append(_HEADER.pack(size))
            out.extend(parts)

    def flush(self) -> None:
        out, self._out = self._out, {}
        for writer, frames in out.items():
            if not writer.is_closing():  # a lost connection fails what waits on it
                writer.writelines(frames)
