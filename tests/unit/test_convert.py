"""The receive path's conversions (roles/frontend/convert.py) against the plain ways."""

from __future__ import annotations

import base64
import random
from datetime import UTC, datetime

import msgspec

from cherami.roles.frontend.convert import received, rfc3339
from cherami.wire.records import Record


def _slow_rfc3339(ms: int) -> str:
    when = datetime.fromtimestamp(ms / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_rfc3339_matches_datetime() -> None:
    rng = random.Random(7)
    samples = [0, 999, 1000, 1_700_000_000_000, 1_700_000_000_999, 4_102_444_799_999]
    samples += [rng.randrange(0, 4_102_444_800_000) for _ in range(20_000)]
    for ms in samples:
        assert rfc3339(ms) == _slow_rfc3339(ms), ms


def test_received_bodies_text_bytes_and_unknown() -> None:
    as_text = Record(1_700_000_000_250, 0, "héllo".encode(), {"k": "v"}, text=True)
    as_bytes = Record(1_700_000_000_250, 0, b"\xff\x00", None, text=False)
    streamed_utf8 = Record(1_700_000_000_250, 0, b"plain", None, text=None)
    streamed_binary = Record(1_700_000_000_250, 0, b"\xff", None, text=None)
    out = [
        msgspec.to_builtins(received("id", "r", rec, 2))
        for rec in (as_text, as_bytes, streamed_utf8, streamed_binary)
    ]
    assert out[0] == {"id": "id", "receipt": "r", "attributes": {"k": "v"},
                      "delivery_count": 2, "enqueued_at": "2023-11-14T22:13:20.250Z",
                      "body": "héllo"}  # fmt: skip
    assert out[1]["body_b64"] == base64.b64encode(b"\xff\x00").decode() and "body" not in out[1]
    assert out[2]["body"] == "plain" and "body_b64" not in out[2]
    assert out[3]["body_b64"] == "/w==" and out[3]["attributes"] == {}


def test_client_parses_what_the_server_formats() -> None:
    from cherami.client.models import ReceiveAnswer, _ms

    rng = random.Random(11)
    for ms in [0, 1, 999, 1_700_000_000_250, *(rng.randrange(0, 4_102_444_800_000)
                                              for _ in range(5_000))]:  # fmt: skip
        assert _ms(rfc3339(ms)) == ms, ms
    assert _ms("2023-11-14T22:13:20.25+00:00") == 1_700_000_000_250  # other RFC 3339 forms
    assert _ms("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    rec = Record(1_700_000_000_250, 0, b"\xff", {"a": "b"}, text=False)
    answer = msgspec.json.decode(
        msgspec.json.encode({"messages": [received("m1", "r1", rec, 3)]}), type=ReceiveAnswer
    )
    (got,) = answer.received()
    assert (got.id, got.receipt, got.body, got.attributes, got.delivery_count,
            got.enqueued_ms) == ("m1", "r1", b"\xff", {"a": "b"}, 3, 1_700_000_000_250)  # fmt: skip
