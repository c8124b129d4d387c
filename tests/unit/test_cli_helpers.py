from __future__ import annotations

import io

import click
import pytest

from cherami.cli.commands import message_json, parse_attributes, read_batches
from cherami.client.models import Received


def test_attributes_split_on_the_first_equals_sign() -> None:
    assert parse_attributes(("a=1", "b=x=y", "c=")) == {"a": "1", "b": "x=y", "c": ""}
    assert parse_attributes(()) == {}
    for bad in ("novalue", "=v"):
        with pytest.raises(click.BadParameter):
            parse_attributes((bad,))


def test_stdin_lines_are_batched_without_blank_lines() -> None:
    data = b"a\r\nb\n\n\xff\xfe\nc\nd\ne"
    batches = list(read_batches(io.BytesIO(data), 2))
    assert batches == [["a", "b"], [b"\xff\xfe", "c"], ["d", "e"]]
    assert list(read_batches(io.BytesIO(b""), 2)) == []


def test_message_json_prints_text_or_base64() -> None:
    text = Received(
        id="id1", body="héllo".encode(), attributes={"k": "v"}, delivery_count=2, enqueued_ms=0
    )
    assert message_json(text) == {
        "id": "id1", "body": "héllo", "delivery_count": 2, "attributes": {"k": "v"},
    }  # fmt: skip
    binary = Received(id="id2", body=b"\xff\x00", delivery_count=1, enqueued_ms=0)
    assert message_json(binary)["body_b64"] == "/wA="
    assert "body" not in message_json(binary)
