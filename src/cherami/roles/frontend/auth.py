"""API keys with scopes (admin, produce, consume) over queue-name prefixes, and their
own publish limits (docs/api.md, "Auth").

The auth file stores each key as the SHA-256 of the key (``key_sha256``, hex). An API
key is a long random token (``cherami keys new`` makes one from 32 random bytes), so a
plain hash is enough: a slow password hash (scrypt, PBKDF2) protects guessable secrets
against brute force, and there is nothing to guess in 256 random bits; a fast hash also
keeps checking a key on every request cheap. A plain ``key`` is still read, with a
warning. A presented key is hashed and compared with every stored hash in constant time
(``hmac.compare_digest``), none skipped.

``KeyRing.reload`` reads the file again (SIGHUP): a file that does not load leaves the
keys in use as they were and says why in one log line."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from typing import Literal

import msgspec

from cherami.errors import Forbidden, InvalidRequest, Unauthorized
from cherami.metadata.models import Rate

log = logging.getLogger("cherami.frontend.auth")

Scope = Literal["admin", "produce", "consume"]
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
KEY_PREFIX = "chk_"  # of keys made by ``cherami keys new`` (easy to spot in a leak scan)


class ApiKey(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    key: str | None = None  # the key in clear (read for compatibility, with a warning)
    key_sha256: str | None = None  # hex SHA-256 of the key: how keys should be stored
    scopes: list[Scope]
    prefixes: list[str] = msgspec.field(default_factory=lambda: [""])
    # this key's own publish limits over every queue it publishes to (0: none); the
    # bursts default to one second's worth (docs/api.md, "Throttling")
    publish_rate: Rate = 0.0  # messages per second
    publish_burst: Rate = 0.0  # messages
    publish_bytes_rate: Rate = 0.0  # bytes of message bodies per second
    publish_bytes_burst: Rate = 0.0

    @property
    def name(self) -> str:
        """How logs and metrics may name the key: the start of its hash, never the key."""
        return "sha256:" + self.digest().hex()[:12]

    def digest(self) -> bytes:
        if self.key_sha256 is not None:
            return bytes.fromhex(self.key_sha256)
        assert self.key is not None
        return hash_key(self.key)


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    """A fresh API key: 32 random bytes, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def parse_keys(raw: bytes, path: str) -> list[ApiKey]:
    """The keys of an auth file's contents; InvalidRequest naming what is wrong."""
    try:
        keys = msgspec.json.decode(raw, type=list[ApiKey])
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        raise InvalidRequest(f"auth file {path}: {err}") from None
    seen: set[bytes] = set()
    for i, key in enumerate(keys):
        if (key.key is None) == (key.key_sha256 is None):
            raise InvalidRequest(f"auth file {path}: entry {i} needs one of key or key_sha256")
        if key.key is not None and not key.key:
            raise InvalidRequest(f"auth file {path}: entry {i} has an empty key")
        if key.key_sha256 is not None and not _HEX64.match(key.key_sha256):
            raise InvalidRequest(f"auth file {path}: entry {i}: key_sha256 must be 64 hex digits")
        digest = key.digest()
        if digest in seen:
            raise InvalidRequest(f"auth file {path}: entry {i} repeats a key")
        seen.add(digest)
    return keys


class KeyRing:
    def __init__(self, keys: list[ApiKey], path: str | None = None) -> None:
        self.path = path
        self._entries: list[tuple[bytes, ApiKey]] = []
        self._keys: tuple[object, tuple[ApiKey, ...]] = (None, ())  # (of which list, keys)
        self._set(keys)

    def _set(self, keys: list[ApiKey]) -> None:
        self._entries = [(k.digest(), k) for k in keys]
        plain = sum(k.key is not None for k in keys)
        if plain:
            log.warning(
                "auth file %s holds %d key(s) in clear: store them hashed as key_sha256 "
                "(cherami keys hash)", self.path, plain,
            )  # fmt: skip

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """The keys in use: a new tuple after each reload (the same one until then, so a
        caller may keep an index of it and build it again when it changes)."""
        if self._keys[0] is not self._entries:
            self._keys = (self._entries, tuple(k for _, k in self._entries))
        return self._keys[1]

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def load(cls, path: str | None) -> KeyRing:
        if not path:
            return cls([])
        with open(path, "rb") as f:
            raw = f.read()
        return cls(parse_keys(raw, path), path)

    def reload(self) -> bool:
        """Read the auth file again (SIGHUP). On success the new keys and limits apply to
        the next request; a file that cannot be read or parsed, or that holds no key
        (a reload never turns auth off), leaves the keys in use and logs one line."""
        if not self.path:
            log.warning("SIGHUP: no --auth-file to reload")
            return False
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
            keys = parse_keys(raw, self.path)
            if not keys and self._entries:
                raise InvalidRequest(f"auth file {self.path} holds no key")
        except (OSError, InvalidRequest) as err:
            reason = err.message if isinstance(err, InvalidRequest) else str(err)
            log.error("auth file not reloaded, the %d key(s) in use stay: %s", len(self), reason)
            return False
        self._set(keys)
        log.info("auth file %s reloaded: %d key(s)", self.path, len(keys))
        return True

    def find(self, header: str | None) -> ApiKey | None:
        """The key an ``Authorization: Bearer <key>`` header carries, if it is known.
        Compares the presented key's hash with every stored one in constant time."""
        if not header or not header.startswith("Bearer "):
            return None
        digest = hash_key(header[7:].strip())
        found: ApiKey | None = None
        for stored, key in self._entries:
            if hmac.compare_digest(digest, stored):
                found = key
        return found

    def check(self, header: str | None, scope: Scope | None, queue: str | None) -> ApiKey | None:
        """The key the Authorization header carries (None when the server has no keys);
        raises unless it is good for this request."""
        if not self._entries:
            return None
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("an API key is required: Authorization: Bearer <key>")
        key = self.find(header)
        if key is None:
            raise Unauthorized("unknown API key")
        if scope is not None and scope not in key.scopes and "admin" not in key.scopes:
            raise Forbidden(f"the key lacks the {scope} scope")
        if queue is not None and not any(queue.startswith(p) for p in key.prefixes):
            raise Forbidden(f"the key does not cover queue {queue}")
        return key
