"""Receipts: the signed token of one delivery.

A receipt names the output host's epoch and the delivery number, and is signed with a
keyed BLAKE2b over the group's name and them (the keyed state after the group's name is
kept per group and copied for each receipt: a receive signs one receipt a message).
Every delivery (a redelivery too) gets a new number, so a receipt is current only while
its delivery is; a receipt from an earlier run of the output host carries another epoch;
a forged one fails the signature.

In a cluster a receipt starts with the issuing output host's tag and a dot
(``tag.signed``), so that a frontend can send its settlement to that host (``tag_of``);
the signature does not cover the tag (a receipt with another tag goes to another host,
whose key it fails)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import struct
from typing import Any

_BODY = struct.Struct(">IQ")
_MAC_SIZE = 10
MAX_RECEIPT = 64


def host_tag(host_id: str) -> str:
    """The receipt tag of an output host: its id's random part."""
    return host_id.rsplit("-", 1)[-1]


def tag_of(receipt: str) -> str:
    """The tag of the output host that issued a receipt ("" when it has none)."""
    tag, dot, _ = receipt.partition(".")
    return tag if dot else ""


class ReceiptSigner:
    def __init__(
        self, secret: bytes | None = None, epoch: int | None = None, tag: str = ""
    ) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.epoch = epoch if epoch is not None else secrets.randbits(32)
        self._prefix = f"{tag}." if tag else ""
        self._scoped: dict[bytes, Any] = {}  # scope -> keyed BLAKE2b state after it

    def _mac(self, scope: bytes, body: bytes) -> bytes:
        state = self._scoped.get(scope)
        if state is None:
            if len(self._scoped) >= 65536:
                self._scoped.clear()
            state = hashlib.blake2b(scope, key=self._secret, digest_size=_MAC_SIZE)
            self._scoped[scope] = state
        mac = state.copy()
        mac.update(body)
        return mac.digest()

    def sign(self, scope: bytes, delivery_no: int) -> str:
        body = _BODY.pack(self.epoch, delivery_no)
        signed = base64.urlsafe_b64encode(body + self._mac(scope, body)).decode().rstrip("=")
        return self._prefix + signed

    def verify(self, scope: bytes, receipt: str) -> int | None:
        """The delivery number a receipt names, or None when it is not ours or not for
        this scope or this epoch."""
        if not isinstance(receipt, str) or len(receipt) > MAX_RECEIPT:
            return None
        if tag_of(receipt) != self._prefix[:-1]:
            return None
        receipt = receipt[len(self._prefix) :]
        try:
            raw = base64.urlsafe_b64decode(receipt + "=" * (-len(receipt) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) != _BODY.size + _MAC_SIZE:
            return None
        body, mac = raw[: _BODY.size], raw[_BODY.size :]
        if not secrets.compare_digest(mac, self._mac(scope, body)):
            return None
        epoch, delivery_no = _BODY.unpack(body)
        return delivery_no if epoch == self.epoch else None
