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


class _Server(_Socket):
    """A stand-in that answers a negative credit as the output host does: it takes back
    what it has not used for deliveries yet (``used`` of its credit went out already)."""

    def __init__(self, used: int = 0) -> None:
        super().__init__()
        self.used = used
        self.asked_back: list[int] = []

    async def send_bytes(self, data: bytes) -> None:
        frame = f.decode_client(data)
        assert isinstance(frame, f.Credit)
        if frame.n >= 0:
            self.credit += frame.n
            return
        unused = self.credit - self.used
        taken = min(-frame.n, unused)
        self.credit -= taken
        self.asked_back.append(taken)


async def test_credit_held_idle_is_asked_back_when_the_route_lists_another_host() -> None:
    # "a" was the only host listed and got all 1000; the route now lists "b" too, and
    # "a" has nothing to deliver: its 1000 sit unused at its server
    consumer = _consumer(1000, expected=1, addresses=[])
    consumer._conns["a"] = _Conn("a", _Server())  # type: ignore[arg-type]
    await consumer._grant()
    assert _socket(consumer, "a").credit == 1000
    consumer._expected = 2
    consumer._conns["b"] = _Conn("b", _Server())  # type: ignore[arg-type]
    await consumer._grant()
    a, b = consumer._conns["a"], consumer._conns["b"]
    assert a.ws.asked_back == [500] and a.reclaiming  # type: ignore[attr-defined]
    await consumer._grant()  # no second request while the first is unanswered
    assert a.ws.asked_back == [500]  # type: ignore[attr-defined]
    consumer._returned(a, 500)  # the server's `returned` answer
    await consumer._grant()
    assert (_socket(consumer, "a").credit, _socket(consumer, "b").credit) == (500, 500)
    assert (a.granted, b.granted) == (500, 500) and not a.reclaiming


async def test_credit_already_used_for_deliveries_stays_where_it_is() -> None:
    # 900 of "a"'s 1000 went to deliveries the consumer holds: only 100 comes back now,
    # and the rest returns as those messages settle
    consumer = _consumer(1000, expected=1, addresses=[])
    consumer._conns["a"] = _Conn("a", _Server(used=900))  # type: ignore[arg-type]
    await consumer._grant()
    consumer._expected = 2
    consumer._conns["b"] = _Conn("b", _Server())  # type: ignore[arg-type]
    await consumer._grant()
    a, b = consumer._conns["a"], consumer._conns["b"]
    consumer._returned(a, a.ws.asked_back[-1])  # type: ignore[attr-defined]
    await consumer._grant()
    assert (a.granted, b.granted) == (900, 100)
    assert sum(c.granted for c in consumer._conns.values()) <= 1000
    a.granted -= 400  # 400 of "a"'s messages settled (StreamConsumer._settled)
    await consumer._grant()
    assert (a.granted, b.granted) == (500, 500)


async def test_streams_at_their_share_are_not_asked_for_credit() -> None:
    consumer = _consumer(1000, expected=2, addresses=[])
    for address in ("a", "b"):
        consumer._conns[address] = _Conn(address, _Server())  # type: ignore[arg-type]
    await consumer._grant()
    await consumer._grant()
    assert all(not c.ws.asked_back for c in consumer._conns.values())  # type: ignore[attr-defined]
