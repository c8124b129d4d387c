"""How a streaming consumer splits its credit over the streams its route lists (the
logic of StreamConsumer._grant, with stand-in sockets: no I/O)."""

from __future__ import annotations

from typing import Any

from cherami.client.stream import StreamConsumer, _Conn
from cherami.wire import stream as f


class _Socket:
    def __init__(self) -> None:
        self.closed = False
        self.credit = 0

    async def send_bytes(self, data: bytes) -> None:
        frame = f.decode_client(data)
        assert isinstance(frame, f.Credit)
        self.credit += frame.n


def _consumer(credit: int, expected: int, addresses: list[str]) -> StreamConsumer:
    consumer = StreamConsumer(client=None, path="/v1/queues/q/groups/g/consume", credit=credit)  # type: ignore[arg-type]
    consumer._expected = expected
    for address in addresses:
        consumer._conns[address] = _Conn(address, _Socket())  # type: ignore[arg-type]
    return consumer


def _socket(consumer: StreamConsumer, address: str) -> Any:
    return consumer._conns[address].ws


async def test_a_reconnecting_stream_keeps_its_share_free() -> None:
    consumer = _consumer(1000, expected=2, addresses=["a"])  # "b" is reconnecting
    await consumer._grant()
    assert _socket(consumer, "a").credit == 500  # not the whole 1000
    consumer._conns["b"] = _Conn("b", _Socket())  # type: ignore[arg-type]
    await consumer._grant()
    assert (_socket(consumer, "a").credit, _socket(consumer, "b").credit) == (500, 500)


async def test_a_stream_that_holds_its_credit_idle_does_not_starve_a_new_one() -> None:
    consumer = _consumer(1000, expected=2, addresses=["a"])
    await consumer._grant()
    consumer._conns["b"] = _Conn("b", _Socket())  # type: ignore[arg-type]
    await consumer._grant()
    await consumer._grant()
    assert _socket(consumer, "b").credit == 500
    assert sum(c.granted for c in consumer._conns.values()) == 1000


async def test_one_listed_stream_gets_all_the_credit() -> None:
    consumer = _consumer(1000, expected=1, addresses=["a"])
    await consumer._grant()
    assert _socket(consumer, "a").credit == 1000
    through_url = _consumer(300, expected=0, addresses=[""])  # a single node: no route
    await through_url._grant()
    assert _socket(through_url, "").credit == 300
