"""A publish frame whose batch id is readable but whose batch is not is refused for that
batch (``BadPublish`` carries the id); any other bad frame stays a plain decode error."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cherami.wire import stream as f


def _frame(*items: Any) -> bytes:
    return msgspec.msgpack.encode(list(items))


def test_a_good_publish_frame_decodes() -> None:
    frame = f.decode_client(f.encode(f.Publish(7, [f.OutMessage(b"x", {"k": "v"}, 5)])))
    assert frame == f.Publish(7, [f.OutMessage(b"x", {"k": "v"}, 5)])


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (_frame("pub", 42, [[b"x", {"k": 1}]]), "$[2][0][1]"),  # attribute value not a string
        (_frame("pub", 42, [["not bytes"]]), "$[2][0][0]"),  # body a string
        (_frame("pub", 42, [[b"x", None, "soon"]]), "$[2][0][2]"),  # delay not an int
        (_frame("pub", 42, "messages"), "$[2]"),  # the batch not an array
        (_frame("pub", 42), ""),  # the batch left out
    ],
)
def test_a_wrong_typed_field_names_its_batch(raw: bytes, where: str) -> None:
    with pytest.raises(f.BadPublish) as caught:
        f.decode_client(raw)
    assert caught.value.id == 42
    assert where in caught.value.message
    assert isinstance(caught.value, msgspec.DecodeError)  # old handlers still catch it


@pytest.mark.parametrize(
    "raw",
    [
        _frame("pub", "42", [[b"x"]]),  # the id itself unreadable
        _frame("ack", "not handles"),  # not a publish frame
        _frame("nope", 1),  # unknown tag
        b"\xc1",  # not msgpack
        msgspec.msgpack.encode({"pub": 1}),  # not an array
    ],
)
def test_a_frame_without_a_readable_batch_id_is_a_plain_decode_error(raw: bytes) -> None:
    with pytest.raises(msgspec.DecodeError) as caught:
        f.decode_client(raw)
    assert not isinstance(caught.value, f.BadPublish)


def test_the_error_frame_carries_the_batch_id() -> None:
    with pytest.raises(f.BadPublish) as caught:
        f.decode_client(_frame("pub", 9, [[1]]))
    reply = f.Error(caught.value.id, "invalid_request", caught.value.message)
    assert f.decode_server(f.encode(reply)) == reply
    assert reply.id == 9
