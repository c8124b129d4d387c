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


@pytest.mark.parametrize("name", ["ack", "nack"])
def test_receipts_that_start_with_a_dash_are_receipts_not_options(name: str) -> None:
    # URL-safe base64: one receipt in 64 starts with "-" (CI once drew "-3...").
    from cherami.cli.main import cli

    command = cli.commands[name]  # type: ignore[attr-defined]
    given = ["-3AbC_x=", "--xY9-", "plain", "-=-"]
    ctx = command.make_context(name, ["q", "g", *given, "--url", "http://h:1"])
    assert list(ctx.params["receipts"]) == given
    assert ctx.params["url"] == "http://h:1"
    if name == "nack":
        ctx = command.make_context(name, ["q", "g", "-Zz", "--delay-seconds", "2"])
        assert list(ctx.params["receipts"]) == ["-Zz"] and ctx.params["delay_seconds"] == 2.0
