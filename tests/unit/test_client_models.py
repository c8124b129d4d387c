"""``Received.text`` on a body that is not UTF-8: a clear error, not a bare decode error."""

from __future__ import annotations

import pickle

import pytest

from cherami.client import models
from cherami.client.models import Received


def delivery(body: bytes) -> Received:
    return Received(id="f625468af25905c4:2", body=body, delivery_count=1, enqueued_ms=0)


def test_text_of_a_utf8_body() -> None:
    assert delivery("héllo".encode()).text == "héllo"
    assert delivery(b"").text == ""


def test_text_of_a_binary_body_says_it_is_not_text_and_where_the_bytes_are() -> None:
    with pytest.raises(ValueError) as caught:
        delivery(b"ab\xff\x00").text  # noqa: B018
    err = caught.value
    assert isinstance(err, models.BodyNotText)
    assert str(err) == (
        "the body of message f625468af25905c4:2 is not UTF-8 text (byte 0xff at 2): "
        "read message.body, its bytes"
    )
    assert err.message_id == "f625468af25905c4:2"
    assert err.__suppress_context__  # no "during handling of the above exception" chain


def test_code_that_caught_the_decode_error_still_catches_it() -> None:
    with pytest.raises(UnicodeDecodeError) as caught:
        delivery(b"\xc3").text  # noqa: B018
    assert (caught.value.encoding, caught.value.start, caught.value.object) == ("utf-8", 0, b"\xc3")


def test_the_error_pickles() -> None:  # e.g. raised in a worker process
    with pytest.raises(models.BodyNotText) as caught:
        delivery(b"\xfe").text  # noqa: B018
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is models.BodyNotText and str(again) == str(caught.value)
