"""How an internal connection proves it belongs to the cluster (docs/protocol.md §6).

Every process of a cluster (and a node with its store-host children) shares a cluster
secret. A connection to a store host opens with the client's hello, before any frame:

    hello   = "CHRMSTR1" | nonce (16 bytes) | time (8 bytes, ms, big-endian)
              | HMAC-SHA256(key, "hello" | nonce | time)              64 bytes
    welcome = HMAC-SHA256(key, "welcome" | nonce)                      32 bytes

The store host answers a hello whose MAC is right, whose time is within ``SKEW`` of its
own clock and whose nonce it has not seen in that window with the welcome, and then
serves frames; any other hello, or none within ``HELLO_TIMEOUT``, is met with a closed
connection and no byte. The client checks the welcome, so it talks only to a store host
of its own cluster. Internal HTTP routes take ``X-Cherami-Internal: <token>`` instead of
an API key (and never an API key).

The key is SHA-256 over the secret. A server process carries its key in its context
(context.py; from ``--cluster-secret-file``, or a node's own), anything else reads it
from the environment (``cluster_key``):
``CHERAMI_CLUSTER_SECRET`` (the secret itself) or ``CHERAMI_CLUSTER_SECRET_FILE``
(a file holding it). A reader outside the cluster (a Spark job) holds no secret: it
shows a read grant instead (wire/grants.py), whose hello has the same shape."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
import time
from collections import OrderedDict

from cherami.errors import Unavailable

MAGIC = b"CHRMSTR1"
GRANT_MAGIC = b"CHRMGRT1"  # a read grant's hello (wire/grants.py)
HELLO_SIZE = len(MAGIC) + 16 + 8 + 32
WELCOME_SIZE = 32
SKEW = 120.0  # seconds a hello's time may differ from the store host's clock
HELLO_TIMEOUT = 5.0  # a connection that sends no hello by then is closed
MAX_GREETING = 256  # connections a store host holds before their hello; more are closed
INTERNAL_HEADER = "X-Cherami-Internal"
SECRET_ENV = "CHERAMI_CLUSTER_SECRET"
SECRET_FILE_ENV = "CHERAMI_CLUSTER_SECRET_FILE"
_TIME = struct.Struct(">Q")


class NoSecret(Unavailable):
    """This process has no cluster secret, so it cannot open an internal connection."""


def derive_key(secret: bytes) -> bytes:
    return hashlib.sha256(b"cherami cluster key\0" + secret.strip()).digest()


def new_secret() -> str:
    return secrets.token_hex(32)


def read_secret_file(path: str) -> bytes:
    with open(path, "rb") as f:
        secret = f.read().strip()
    if len(secret) < 16:
        raise ValueError(f"cluster secret file {path} holds fewer than 16 bytes")
    return secret


def cluster_key() -> bytes:
    """The environment's key (read again at each call: a Spark driver may point it at
    another node's file); a server process's roles use the key of its context."""
    if os.environ.get(SECRET_ENV):
        return derive_key(os.environ[SECRET_ENV].encode())
    if os.environ.get(SECRET_FILE_ENV):
        return derive_key(read_secret_file(os.environ[SECRET_FILE_ENV]))
    raise NoSecret(
        f"no cluster secret: set {SECRET_ENV} or {SECRET_FILE_ENV} (a node keeps its "
        "secret in DATA_DIR/cluster.secret)"
    )


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def hello(key: bytes, magic: bytes = MAGIC) -> tuple[bytes, bytes]:
    """A client's hello and its nonce (to check the welcome with); ``magic``
    GRANT_MAGIC with a read grant's key (wire/grants.py)."""
    nonce = secrets.token_bytes(16)
    stamp = _TIME.pack(int(time.time() * 1000))
    return magic + nonce + stamp + _mac(key, b"hello", nonce, stamp), nonce


def welcome(key: bytes, nonce: bytes) -> bytes:
    return _mac(key, b"welcome", nonce)


def welcome_ok(key: bytes, nonce: bytes, answer: bytes) -> bool:
    return hmac.compare_digest(welcome(key, nonce), answer)


def internal_token(key: bytes) -> str:
    """The value of X-Cherami-Internal on internal HTTP requests."""
    return _mac(key, b"internal http").hex()


def internal_ok(key: bytes, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(internal_token(key), header)


class HelloChecker:
    """The store host's side: which hellos to answer (see the module)."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # nonce -> when, for replays

    def check(self, data: bytes, grant_key: bytes | None = None) -> bytes | None:
        """The nonce of a good hello, or None: a cluster hello, or with ``grant_key``
        a read grant's hello proved with that key (wire/grants.py)."""
        magic, key = (MAGIC, self.key) if grant_key is None else (GRANT_MAGIC, grant_key)
        if len(data) != HELLO_SIZE or not data.startswith(magic):
            return None
        body = data[len(magic) :]
        nonce, stamp, mac = body[:16], body[16:24], body[24:]
        if not hmac.compare_digest(_mac(key, b"hello", nonce, stamp), mac):
            return None
        now = time.time()
        if abs(_TIME.unpack(stamp)[0] / 1000 - now) > SKEW:
            return None
        while self._seen and next(iter(self._seen.values())) < now - 2 * SKEW:
            self._seen.popitem(last=False)
        if nonce in self._seen:
            return None
        self._seen[nonce] = now
        return nonce
