"""Length-prefixed frames over asyncio streams: a 4-byte big-endian length, then the body.

Store-host connections read with ``FrameReader``: a buffered protocol that parses frames
as bytes arrive and reads a large frame's body straight into a buffer of its own, where
a ``StreamReader`` copies every byte three times on the way (the event loop's bytes, its
buffer, the slice handed out)."""

from __future__ import annotations

import asyncio
import collections
import struct
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from cherami.errors import ProtocolError

MAX_FRAME = 64 << 20
READ_BUFFER = 1 << 20  # larger stream buffers slow the consume path
_HEADER = struct.Struct(">I")
_JOIN_BELOW = 16 << 10  # smaller frames are copied behind their header: fewer buffers
_CHUNK = 256 << 10  # FrameReader's buffer for headers and small frames
# its buffer until it first fills past the preamble: a connection that never sends a
# hello (or a valid one) holds this much, not _CHUNK
_FIRST = 4 << 10
_DIRECT = 64 << 10  # frames from this size are read into a buffer of their own


def pack_frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


class _Writer(Protocol):
    def writelines(self, parts: Sequence[bytes], /) -> None: ...

    def is_closing(self) -> bool: ...


class Cork:
    """Frames for one or more streams, written at the end of the event-loop turn: what a
    stream is sent in one turn leaves in one write, in order. A loopback write is a system
    call that wakes the process at the other end; one per turn instead of one per frame
    (docs/protocol.md)."""

    def __init__(self) -> None:
        self._out: dict[_Writer, list[bytes]] = {}

    def send(self, writer: _Writer, body: bytes) -> None:
        self.send_parts(writer, (body,))

    def send_parts(self, writer: _Writer, parts: Sequence[bytes]) -> None:
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


class FrameReader(asyncio.BufferedProtocol):
    """The reading end of a framed connection: first ``preamble`` raw bytes (a hello),
    then frames. Frames are parsed as they arrive and queued; past ``limit`` queued bytes
    the transport stops reading until the reader catches up (as a StreamReader's limit)."""

    def __init__(
        self, preamble: int = 0, limit: int = READ_BUFFER, max_frame: int = MAX_FRAME
    ) -> None:
        """``max_frame``: larger frames end the connection (a server keeps it small until
        the peer has proved itself, then sets ``max_frame`` to MAX_FRAME)."""
        self.max_frame = max_frame
        self._buf = bytearray(max(_FIRST, preamble))
        self._start = self._end = 0  # bytes received and not yet parsed: _buf[_start:_end]
        self._preamble = preamble
        self._body = -1  # the length of the frame whose body is awaited, -1: a header is
        self._big: bytearray | None = None  # a large frame's body, being filled
        self._big_len = 0
        self._frames: collections.deque[bytes | bytearray] = collections.deque()
        self._queued = 0
        self._limit = limit
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None  # while writing is paused
        self._ended: BaseException | None = None  # why no more frames will come
        self.transport: asyncio.Transport | None = None

    # --- the transport's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return memoryview(self._big)[self._big_len :]
        if self._end == len(self._buf):  # move what is left of a small frame to the front
            left = self._end - self._start
            if not self._preamble and len(self._buf) < _CHUNK:  # past the hello: grow
                grown = bytearray(_CHUNK)
                grown[:left] = self._buf[self._start : self._end]
                self._buf = grown
            else:
                self._buf[:left] = self._buf[self._start : self._end]
            self._start, self._end = 0, left
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is not None:
            self._big_len += nbytes
            if self._big_len == len(self._big):
                big, self._big = self._big, None
                self._push(big)
            return
        self._end += nbytes
        try:
            self._parse()
        except ProtocolError as err:
            self._end_with(err)
            assert self.transport is not None
            self.transport.abort()

    def _parse(self) -> None:
        buf = self._buf
        while True:
            have = self._end - self._start
            if self._preamble:
                if have < self._preamble:
                    break
                self._push(bytes(buf[self._start : self._start + self._preamble]))
                self._start += self._preamble
                self._preamble = 0
            elif self._body < 0:
                if have < 4:
                    break
                (size,) = _HEADER.unpack_from(buf, self._start)
                if size > self.max_frame:
                    raise ProtocolError(f"frame of {size} bytes exceeds {self.max_frame}")
                self._start += 4
                self._body = size
            elif have >= self._body:
                self._push(bytes(buf[self._start : self._start + self._body]))
                self._start += self._body
                self._body = -1
            elif self._body >= _DIRECT:  # the rest is read straight into its own buffer
                self._big = bytearray(self._body)
                self._big[:have] = buf[self._start : self._end]
                self._big_len = have
                self._start = self._end = 0
                self._body = -1
                return
            else:
                break
        if self._start == self._end:
            self._start = self._end = 0

    def _push(self, frame: bytes | bytearray) -> None:
        self._frames.append(frame)
        self._queued += len(frame)
        if self._queued > self._limit and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end_with(self, why: BaseException) -> None:
        if self._ended is None:
            self._ended = why
        self._wake()

    def eof_received(self) -> bool | None:
        self._end_with(asyncio.IncompleteReadError(b"", None))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        # nothing more arrives: the read buffers go now, not when the garbage collector
        # gets to the connection (its task and this protocol refer to each other)
        self._buf, self._big = bytearray(), None
        self._start = self._end = 0
        self._end_with(exc if exc is not None else asyncio.IncompleteReadError(b"", None))
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)  # nothing more will drain: the replies tell

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # --- the reader's side
    async def read_frame(self) -> bytes | bytearray:
        """The next frame's body (the preamble first, if there is one); raises
        ``asyncio.IncompleteReadError`` at the end of the stream (also in mid-frame), the
        connection's error when it was lost, ``ProtocolError`` for an oversized frame."""
        while not self._frames:
            if self._ended is not None:
                raise self._ended
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        frame = self._frames.popleft()
        was, self._queued = self._queued, self._queued - len(frame)
        if was > self._limit >= self._queued and self.transport is not None:
            self.transport.resume_reading()
        return frame

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._drained is not None:
            await self._drained


class FrameWriter:
    """The writing end: what ``Cork`` and the store host's peers need of a StreamWriter."""

    def __init__(self, transport: asyncio.Transport, reader: FrameReader) -> None:
        self.transport = transport
        self._reader = reader

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def writelines(self, parts: Sequence[bytes]) -> None:
        self.transport.writelines(parts)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def close(self) -> None:
        self.transport.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    async def drain(self) -> None:
        await self._reader.drain()


async def open_framed(
    host: str, port: int, preamble: int, **kwargs: Any
) -> tuple[FrameReader, FrameWriter]:
    """Connect (``kwargs`` as for ``loop.create_connection``: ssl, server_hostname)."""
    loop = asyncio.get_running_loop()
    transport, reader = await loop.create_connection(
        lambda: FrameReader(preamble), host, port, **kwargs
    )
    return reader, FrameWriter(transport, reader)


async def start_framed_server(
    serve: Callable[[FrameReader, FrameWriter], Coroutine[Any, Any, None]],
    host: str,
    port: int,
    preamble: int,
    max_frame: int = MAX_FRAME,
    **kwargs: Any,
) -> asyncio.Server:
    """Serve framed connections: ``serve(reader, writer)`` runs as a task per connection
    (``max_frame``: each connection's first limit, see FrameReader; ``kwargs`` as for
    ``loop.create_server``: ssl)."""
    loop = asyncio.get_running_loop()

    class _Connection(FrameReader):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            writer = FrameWriter(transport, self)  # type: ignore[arg-type]
            self.task: asyncio.Task[None] = loop.create_task(serve(self, writer))

    return await loop.create_server(
        lambda: _Connection(preamble, max_frame=max_frame), host, port, **kwargs
    )
