"""What a publish request lists for each kind of message a producer hands the client:
the fast path for plain bodies says exactly what OutgoingMessage.to_json says."""

from __future__ import annotations

import msgspec

from cherami.client.models import OutgoingMessage, outgoing, publish_item


class Text(str):
    pass


def test_plain_bodies_list_as_an_outgoing_message_would() -> None:
    for item in [b"\x00\xffbytes", "text \u00e9", b"", "", Text("a str subclass"),
                 bytearray(b"mutable")]:  # fmt: skip
        assert publish_item(item) == outgoing(item).to_json()  # type: ignore[arg-type]
        encoded = msgspec.json.encode(publish_item(item))  # type: ignore[arg-type]
        assert encoded == msgspec.json.encode(outgoing(item).to_json())  # type: ignore[arg-type]


def test_outgoing_messages_keep_every_field() -> None:
    item = OutgoingMessage(b"b", attributes={"k": "v"}, delay_seconds=1.5, dedup_id="d")
    assert publish_item(item) == {"body_b64": b"b", "attributes": {"k": "v"},
                                  "delay_seconds": 1.5, "dedup_id": "d"}  # fmt: skip
    assert publish_item(OutgoingMessage("t")) == {"body": "t"}


def test_a_publish_takes_one_message_or_an_iterable_of_them() -> None:
    from cherami.client.models import message_list

    assert message_list("abc") == ["abc"]
    assert message_list(b"abc") == [b"abc"]
    one = OutgoingMessage("x")
    assert message_list(one) == [one]
    assert message_list(iter(["a", b"b"])) == ["a", b"b"]
    for wrong, says in [({"a": 1}, "a dict is not a message"), (5, "not int"),
                        ([1], "not int"), ([{"a": 1}], "not dict")]:  # fmt: skip
        try:
            message_list(wrong)
        except TypeError as err:
            assert says in str(err)
        else:
            raise AssertionError(f"{wrong!r} was taken")
