"""A framed connection inside one process: two ends joined by an in-memory pipe instead of
a socket (what an in-process store host is reached through, roles/storehost/inprocess.py).

Each end is a ``FrameReader`` and ``FrameWriter`` as ``open_framed`` and
``start_framed_server`` give them, over a transport that hands what is written to the
other end's reader on the next turn of the event loop, in order. Flow control works as
on a socket: a reader that has queued too much pauses its peer's deliveries, and a
writer whose undelivered bytes pass ``HIGH_WATER`` is told to pause (``drain`` waits).
Closing an end delivers what it wrote first, then the other end reads the end of the
stream; aborting drops what was not delivered."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from cherami.wire.framing import MAX_FRAME, FrameReader, FrameWriter

HIGH_WATER = 1 << 20  # undelivered bytes past which the writing end is paused


class PipeTransport(asyncio.Transport):
    """One end of the pipe: what it writes goes to ``peer``'s protocol."""

    def __init__(self, protocol: FrameReader, name: str) -> None:
        super().__init__()
        self._protocol = protocol
        self._name = name
        self.peer: PipeTransport | None = None
        self._out: deque[bytes] = deque()  # written, not yet delivered to the peer
        self._size = 0
        self._closing = False
        self._lost = False
        self._paused = False  # the peer paused reading (its queue is full)
        self._writing_paused = False
        self._scheduled = False

    # --- the writing side
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._out.append(bytes(data))
        self._size += len(data)
        if self._size > HIGH_WATER and not self._writing_paused:
            self._writing_paused = True
            self._protocol.pause_writing()
        self._schedule()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return self._size

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._deliver)

    def _deliver(self) -> None:
        """Hand what was written to the peer's reader, as far as it reads."""
        self._scheduled = False
        peer = self.peer
        if peer is None or peer._lost:
            self._out.clear()
            self._size = 0
        while self._out and not self._paused:
            data = self._out.popleft()
            self._size -= len(data)
            assert peer is not None
            _feed(peer._protocol, data)
            if peer._lost:  # its reader refused what came (an oversized frame)
                break
        if self._writing_paused and self._size <= HIGH_WATER // 4:
            self._writing_paused = False
            self._protocol.resume_writing()
        if self._closing and not self._out:
            self._finish(abort=False)

    # --- the reading side (the peer is paused while this end's reader is full)
    def pause_reading(self) -> None:
        if self.peer is not None:
            self.peer._paused = True

    def resume_reading(self) -> None:
        if self.peer is not None and self.peer._paused:
            self.peer._paused = False
            self.peer._schedule()

    def is_reading(self) -> bool:
        return self.peer is not None and not self.peer._paused

    # --- the end of it
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Deliver what was written, then end the stream (both ends are lost)."""
        if not self._closing:
            self._closing = True
            self._schedule()

    def abort(self) -> None:
        self._closing = True
        self._out.clear()
        self._size = 0
        self._finish(abort=True)

    def _finish(self, abort: bool) -> None:
        for end in (self, self.peer):
            if end is not None and not end._lost:
                end._lost = end._closing = True
                end._out.clear()
                loop = asyncio.get_running_loop()
                if end is self.peer and not abort:
                    loop.call_soon(end._protocol.eof_received)
                error = ConnectionResetError("the pipe was aborted") if abort else None
                loop.call_soon(end._protocol.connection_lost, error)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._name if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return HIGH_WATER // 4, HIGH_WATER


def _feed(protocol: FrameReader, data: bytes) -> None:
    """Give ``data`` to a buffered protocol the way the event loop does: into the buffers
    it hands out, as many times as it takes."""
    view = memoryview(data)
    while view:
        buffer = protocol.get_buffer(len(view))
        n = min(len(buffer), len(view))
        buffer[:n] = view[:n]
        view = view[n:]
        protocol.buffer_updated(n)


def framed_pipe(
    client_preamble: int, server_preamble: int, server_max_frame: int = MAX_FRAME, name: str = ""
) -> tuple[tuple[FrameReader, FrameWriter], tuple[FrameReader, FrameWriter]]:
    """The two ends of a new connection: (the client's, the server's) reader and writer,
    the readers expecting ``*_preamble`` raw bytes first (as ``open_framed`` and
    ``start_framed_server``)."""
    client = FrameReader(client_preamble)
    server = FrameReader(server_preamble, max_frame=server_max_frame)
    client_end = PipeTransport(client, f"pipe:{name}:client")
    server_end = PipeTransport(server, f"pipe:{name}:server")
    client_end.peer, server_end.peer = server_end, client_end
    client.connection_made(client_end)
    server.connection_made(server_end)
    return (client, FrameWriter(client_end, client)), (server, FrameWriter(server_end, server))
