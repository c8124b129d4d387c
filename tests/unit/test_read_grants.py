"""Read grants without sockets (wire/grants.py): what a store host accepts as a grant
hello and what it lets a grant connection do, when a holder renews, and the Spark
driver's grant cache (spark/access.py) with the frontend replaced by a counting stand-in."""

from __future__ import annotations

import msgspec
import pytest

from cherami.errors import InvalidRequest
from cherami.wire import grants
from cherami.wire import handshake as h
from cherami.wire import store as w
from cherami.wire.store import PLAIN

KEY = h.derive_key(b"a test cluster secret of 32 bytes")
NOW = 1_800_000_000.0


def _split(grant: grants.ReadGrant) -> tuple[bytes, bytes]:
    """The 64-byte hello and the token frame's body of a grant hello."""
    data, _ = grants.hello(grant)
    first, frame = data[: h.HELLO_SIZE], data[h.HELLO_SIZE :]
    assert int.from_bytes(frame[:4]) == len(frame) - 4
    return first, frame[4:]


def test_a_store_host_welcomes_a_good_grant_and_no_forgery() -> None:
    grant = grants.issue(KEY, "orders", ["e1"], 600)
    first, token = _split(grant)
    checked = grants.check(h.HelloChecker(KEY), first, token)
    assert checked is not None and checked[1].extents == ["e1"]
    assert checked[1].queue == "orders"

    body = msgspec.msgpack.decode(token, type=grants.GrantBody)
    widened = msgspec.msgpack.encode(
        grants.GrantBody(body.version, body.queue, ["e1", "e2"], body.expires_ms, body.id)
    )
    later = msgspec.msgpack.encode(
        grants.GrantBody(body.version, body.queue, ["e1"], body.expires_ms + 10**9, body.id)
    )
    for forged_token in (widened, later, b"\x00" * 40, b"x" * (grants.MAX_TOKEN + 1)):
        hello, _ = grants.hello(grants.ReadGrant(forged_token, grant.key, 0, 0))
        assert grants.check(h.HelloChecker(KEY), hello[:64], forged_token) is None
    other_cluster = h.derive_key(b"another cluster's secret, 32 b!")
    assert grants.check(h.HelloChecker(other_cluster), *_split(grant)) is None
    # a cluster hello is not a grant hello, nor the other way round
    assert h.HelloChecker(KEY).check(first) is None
    cluster_hello, _ = h.hello(KEY)
    assert grants.check(h.HelloChecker(KEY), cluster_hello, token) is None
    # replayed: the same hello twice
    checker = h.HelloChecker(KEY)
    first, token = _split(grant)
    assert grants.check(checker, first, token) is not None
    assert grants.check(checker, first, token) is None


def test_a_grant_connection_may_read_its_extents_until_it_expires_and_nothing_else() -> None:
    grant = grants.issue(KEY, "orders", ["e1"], 600, now=NOW)
    body = msgspec.msgpack.decode(grant.token, type=grants.GrantBody)
    now_ms = NOW * 1000
    assert grants.refusal(body, w.Read(1, "e1", b"", 10), now_ms) is None
    assert grants.refusal(body, w.Read(1, "e1", b"", 10), now_ms + 599_999) is None
    expired = grants.refusal(body, w.Read(2, "e1", b"", 10), now_ms + 600_000)
    assert expired is not None and (expired.rid, expired.code) == (2, "grant_expired")
    other = grants.refusal(body, w.Read(3, "e2", b"", 10), now_ms)
    assert other is not None and other.code == "forbidden" and "e2" in other.message
    records = w.pack_records([b"x"])
    for request in (
        w.Append(4, "e1", 1, records),
        w.Seal(5, "e1"),
        w.Drop(6, "e1"),
        w.CreateExtent(7, "e1", PLAIN),
        w.Info(8, ["e1"]),
        w.Commit(9, "e1", 1),
    ):
        refused = grants.refusal(body, request, now_ms)
        assert refused is not None and refused.code == "forbidden", request
        assert refused.rid == request.rid


def test_a_holder_renews_once_two_thirds_of_the_lifetime_have_passed() -> None:
    grant = grants.issue(KEY, "orders", ["e1"], 600, now=NOW)
    assert grant.expires_ms == NOW * 1000 + 600_000 and grant.lifetime_ms == 600_000
    assert not grant.stale(NOW * 1000 + 399_999)
    assert grant.stale(NOW * 1000 + 400_000)


class _Frontend:
    """The frontend's read-grants call, counted (GrantSource.ask without HTTP)."""

    def __init__(self, lifetime: float) -> None:
        self.asked: list[list[str]] = []
        self.now = NOW
        self.lifetime = lifetime

    def ask(self, extents: list[str]) -> dict[str, grants.ReadGrant]:
        self.asked.append(extents)
        return {e: grants.issue(KEY, "orders", [e], self.lifetime, self.now) for e in extents}


def test_the_driver_asks_once_per_fresh_extent_and_again_when_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cherami.spark import access

    for name in (h.SECRET_ENV, h.SECRET_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    frontend = _Frontend(lifetime=60)
    source = access.GrantSource("http://frontend", "key", "orders")
    monkeypatch.setattr(access.GrantSource, "ask", lambda self, extents: frontend.ask(extents))
    clock = [NOW]
    monkeypatch.setattr(access.time, "time", lambda: clock[0])
    reads = access.ReadAccess(source)
    assert reads.key is None and reads.renewer is source  # no secret: grants
    first = reads.credentials(["e1", "e2"])
    assert frontend.asked == [["e1", "e2"]]
    clock[0] += 30  # half the lifetime: the same grants, no request
    assert reads.credentials(["e1", "e2"]) == first
    assert reads.credentials(["e1", "e3"])["e1"] == first["e1"]
    assert frontend.asked == [["e1", "e2"], ["e3"]]
    clock[0] += 11  # past two thirds of e1's: a new one
    frontend.now = clock[0]
    renewed = reads.credentials(["e1"])
    assert frontend.asked[-1] == ["e1"] and renewed["e1"] != first["e1"]


def test_with_the_secret_in_its_environment_the_driver_reads_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cherami.spark import access

    monkeypatch.setenv(h.SECRET_ENV, "a test cluster secret of 32 bytes")
    reads = access.ReadAccess(access.GrantSource("http://frontend", None, "orders"))
    assert reads.renewer is None
    assert reads.credentials(["e1"]) == {"e1": KEY}


def test_the_read_grant_lifetime_option() -> None:
    from cherami.spark.options import Options

    assert Options.parse({"queue": "q"}).grant_lifetime is None
    assert Options.parse({"queue": "q", "readGrantLifetime": "5m"}).grant_lifetime == 300.0
    for bad in ("500ms", "2h", "soon"):
        with pytest.raises(InvalidRequest, match="readGrantLifetime"):
            Options.parse({"queue": "q", "readGrantLifetime": bad})
