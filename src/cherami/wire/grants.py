"""Read grants: how a reader without the cluster secret (a Spark job) reads extents from
store hosts (docs/protocol.md §7, "Read grants").

The frontend issues a grant to a caller whose API key may consume a queue
(``POST /v1/queues/{queue}/read-grants``): a token that names the extents it covers and
when it expires, and the grant's key, which the frontend signs the token with:

    token = msgpack [1, queue, [extent, ...], expires_ms, id (8 random bytes)]
    key   = HMAC-SHA256(cluster key, "read grant" | token)

The holder opens a store-host connection with a grant hello, then the token as a frame:

    hello   = "CHRMGRT1" | nonce (16) | time (8, ms) | HMAC-SHA256(key, "hello" | nonce | time)
    token   = one frame (4-byte length, then the token; at most MAX_TOKEN bytes)
    welcome = HMAC-SHA256(key, "welcome" | nonce)

The store host derives the key from the token with the cluster key: a hello proved with
it (time within SKEW, nonce not seen) shows the token is the frontend's, unchanged, and
its welcome shows the reader it talks to a store host of the cluster. The key never
goes on the wire. On such a connection the store host serves ``Read`` of the grant's
extents until it expires and refuses every other request (``Failed``: ``forbidden``; a
read after the expiry: ``grant_expired``)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

import msgspec

from cherami.wire import handshake as h
from cherami.wire import store as w
from cherami.wire.framing import pack_frame

VERSION = 1
MAX_TOKEN = 2048  # bytes: a token past it is refused (read before the hello is proved)
DEFAULT_LIFETIME = 600.0  # seconds a grant lasts unless asked for less
MAX_LIFETIME = 3600.0


class GrantBody(msgspec.Struct, array_like=True, frozen=True):
    version: int
    queue: str
    extents: list[str]
    expires_ms: int
    id: bytes


_decoder = msgspec.msgpack.Decoder(GrantBody)
_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class ReadGrant:
    """What a holder keeps: the token it shows, the key it proves it with (secret), and
    when it expires and how long it lasted (to renew it in time)."""

    token: bytes
    key: bytes
    expires_ms: int
    lifetime_ms: int

    def stale(self, now_ms: float | None = None) -> bool:
        """Whether two thirds of its lifetime have passed: time to ask for a new one."""
        now = time.time() * 1000 if now_ms is None else now_ms
        return now >= self.expires_ms - self.lifetime_ms / 3


def grant_key(cluster_key: bytes, token: bytes) -> bytes:
    return hmac.new(cluster_key, b"read grant" + token, hashlib.sha256).digest()


def issue(
    cluster_key: bytes, queue: str, extents: list[str], lifetime: float, now: float | None = None
) -> ReadGrant:
    """A grant to read ``extents`` of ``queue`` for ``lifetime`` seconds from ``now``."""
    now_ms = int((time.time() if now is None else now) * 1000)
    lifetime_ms = int(lifetime * 1000)
    body = GrantBody(VERSION, queue, extents, now_ms + lifetime_ms, secrets.token_bytes(8))
    token = _encoder.encode(body)
    return ReadGrant(token, grant_key(cluster_key, token), body.expires_ms, lifetime_ms)


def hello(grant: ReadGrant) -> tuple[bytes, bytes]:
    """The bytes a reader opens a connection with (the hello, then the token's frame),
    and the nonce to check the welcome with."""
    first, nonce = h.hello(grant.key, h.GRANT_MAGIC)
    return first + pack_frame(grant.token), nonce


def check(checker: h.HelloChecker, first: bytes, token: bytes) -> tuple[bytes, GrantBody] | None:
    """The store host's side: the nonce and the grant of a good grant hello (``first``,
    the 64-byte hello; ``token``, the frame after it), or None. An expired grant is
    still welcomed (its reads get ``grant_expired``, which tells the reader why)."""
    if len(token) > MAX_TOKEN:
        return None
    try:
        body = _decoder.decode(token)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if body.version != VERSION:
        return None
    nonce = checker.check(first, grant_key(checker.key, token))
    return None if nonce is None else (nonce, body)


def refusal(grant: GrantBody, request: w.Request, now_ms: float) -> w.Failed | None:
    """Why a grant connection may not make ``request`` (None: it may)."""
    if not isinstance(request, w.Read):
        what = type(request).__name__
        return w.Failed(request.rid, "forbidden", f"a read grant allows reads only, not {what}")
    if request.extent not in grant.extents:
        return w.Failed(
            request.rid, "forbidden",
            f"the read grant (queue {grant.queue}) does not cover extent {request.extent}",
        )  # fmt: skip
    if now_ms >= grant.expires_ms:
        return w.Failed(
            request.rid, "grant_expired",
            f"the read grant expired {(now_ms - grant.expires_ms) / 1000:.1f} s ago: ask the "
            "frontend for a new one (POST /v1/queues/{queue}/read-grants)",
        )  # fmt: skip
    return None
