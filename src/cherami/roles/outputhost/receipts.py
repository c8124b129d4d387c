"""Receipts: the signed token of one delivery.

A receipt names the output host's epoch and the delivery number, and is signed with a
keyed BLAKE2b over the group's name. Every delivery (a redelivery too) gets a new
number, so a receipt is current only while its delivery is; a receipt from an earlier
run of the output host carries another epoch; a forged one fails the signature."""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import struct

_BODY = struct.Struct(">IQ")
_MAC_SIZE = 10


class ReceiptSigner:
    def __init__(self, secret: bytes | None = None, epoch: int | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.epoch = epoch if epoch is not None else secrets.randbits(32)

    def _mac(self, scope: bytes, body: bytes) -> bytes:
        return hashlib.blake2b(body + scope, key=self._secret, digest_size=_MAC_SIZE).digest()

    def sign(self, scope: bytes, delivery_no: int) -> str:
        body = _BODY.pack(self.epoch, delivery_no)
        return base64.urlsafe_b64encode(body + self._mac(scope, body)).decode().rstrip("=")

    def verify(self, scope: bytes, receipt: str) -> int | None:
        """The delivery number a receipt names, or None when it is not ours or not for
        this scope or this epoch."""
        if not isinstance(receipt, str) or len(receipt) > 64:
            return None
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
