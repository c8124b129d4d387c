"""FrameReader, driven the way an event loop drives a buffered protocol: bytes copied
into whatever buffer it hands out, in pieces of every size."""

from __future__ import annotations

import asyncio
import random

import pytest

from cherami.errors import ProtocolError
from cherami.wire.framing import _CHUNK, _DIRECT, MAX_FRAME, FrameReader, pack_frame


class _Transport:
    def __init__(self) -> None:
        self.paused = self.aborted = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def abort(self) -> None:
        self.aborted = True


def _feed(reader: FrameReader, data: bytes, pieces: list[int]) -> None:
    """``data`` delivered in reads of at most ``pieces[i]`` bytes (and of the buffer)."""
    at, i = 0, 0
    while at < len(data):
        buf = reader.get_buffer(-1)
        n = min(len(buf), pieces[i % len(pieces)], len(data) - at)
        assert n > 0, "the reader handed out no room"
        buf[:n] = data[at : at + n]
        reader.buffer_updated(n)
        at, i = at + n, i + 1


def _reader(preamble: int = 0, limit: int = 1 << 30) -> tuple[FrameReader, _Transport]:
    reader, transport = FrameReader(preamble, limit), _Transport()
    reader.connection_made(transport)  # type: ignore[arg-type]
    return reader, transport


async def _all(reader: FrameReader, n: int) -> list[bytes]:
    return [bytes(await reader.read_frame()) for _ in range(n)]


@pytest.mark.parametrize("pieces", [[1], [3, 7], [4096], [_CHUNK], [1 << 30], [5, 70_000, 2]])
async def test_frames_of_every_size_come_out_whole_whatever_the_reads(pieces: list[int]) -> None:
    rng = random.Random(7)
    sizes = [0, 1, 5, _DIRECT - 1, _DIRECT, _DIRECT + 1, 3, _CHUNK + 10, 2 * _CHUNK, 17, 200_000]
    bodies = [rng.randbytes(n) for n in sizes]
    reader, _ = _reader(preamble=6)
    _feed(reader, b"HELLO!" + b"".join(pack_frame(b) for b in bodies), pieces)
    assert await _all(reader, len(bodies) + 1) == [b"HELLO!", *bodies]


async def test_the_end_of_the_stream_ends_the_frames_also_in_mid_frame() -> None:
    reader, _ = _reader()
    _feed(reader, pack_frame(b"one") + pack_frame(b"x" * 100_000)[:50_000], [10_000])
    reader.eof_received()
    assert bytes(await reader.read_frame()) == b"one"
    with pytest.raises(asyncio.IncompleteReadError):
        await reader.read_frame()
    reader, _ = _reader()
    reader.connection_lost(ConnectionResetError("reset"))
    with pytest.raises(ConnectionResetError):
        await reader.read_frame()


async def test_an_oversized_frame_is_refused_and_the_connection_aborted() -> None:
    reader, transport = _reader()
    _feed(reader, (MAX_FRAME + 1).to_bytes(4, "big") + b"xx", [100])
    assert transport.aborted
    with pytest.raises(ProtocolError):
        await reader.read_frame()


async def test_a_reader_that_falls_behind_pauses_the_transport_until_it_catches_up() -> None:
    reader, transport = _reader(limit=250_000)
    _feed(reader, b"".join(pack_frame(bytes(100_000)) for _ in range(4)), [65_536])
    assert transport.paused  # 400,000 bytes queued
    await reader.read_frame()
    assert transport.paused  # 300,000 still queued: above the limit
    await reader.read_frame()
    assert not transport.paused  # 200,000
    assert len(await _all(reader, 2)) == 2


async def test_a_waiting_reader_wakes_when_a_frame_arrives() -> None:
    reader, _ = _reader()
    waiting = asyncio.create_task(reader.read_frame())
    await asyncio.sleep(0)
    assert not waiting.done()
    _feed(reader, pack_frame(b"late"), [2])
    assert bytes(await waiting) == b"late"
