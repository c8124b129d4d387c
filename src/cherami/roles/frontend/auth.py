"""API keys with scopes (admin, produce, consume) over queue-name prefixes."""

from __future__ import annotations

from typing import Literal

import msgspec

from cherami.errors import Forbidden, InvalidRequest, Unauthorized

Scope = Literal["admin", "produce", "consume"]


class ApiKey(msgspec.Struct, frozen=True):
    key: str
    scopes: list[Scope]
    prefixes: list[str] = msgspec.field(default_factory=lambda: [""])


class KeyRing:
    def __init__(self, keys: list[ApiKey]) -> None:
        self._keys = {k.key: k for k in keys}

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    @classmethod
    def load(cls, path: str | None) -> KeyRing:
        if not path:
            return cls([])
        with open(path, "rb") as f:
            raw = f.read()
        try:
            return cls(msgspec.json.decode(raw, type=list[ApiKey]))
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            raise InvalidRequest(f"auth file {path}: {err}") from None

    def check(self, header: str | None, scope: Scope | None, queue: str | None) -> None:
        """Raise unless the Authorization header carries a key good for this request."""
        if not self._keys:
            return
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("an API key is required: Authorization: Bearer <key>")
        key = self._keys.get(header[7:].strip())
        if key is None:
            raise Unauthorized("unknown API key")
        if scope is not None and scope not in key.scopes and "admin" not in key.scopes:
            raise Forbidden(f"the key lacks the {scope} scope")
        if queue is not None and not any(queue.startswith(p) for p in key.prefixes):
            raise Forbidden(f"the key does not cover queue {queue}")
