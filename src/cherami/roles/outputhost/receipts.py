"""Receipts: the signed token of one delivery.

A receive signs its batch once: the deliveries a receive hands out have consecutive
numbers, and their receipts share one signed part, a keyed BLAKE2b over the group's
name, the output host's epoch, the batch's first delivery number and its size; each
receipt adds its place in the batch after a ``~`` (``<signed>~<index>``). Verifying a
settlement's receipts checks each distinct signed part once. The index is not signed:
it is checked against the signed size, so a receipt can only name a delivery of the
batch it came from, all of which that one receive answered to the same caller.

Every delivery (a redelivery too) gets a new number, so a receipt is current only while
its delivery is; a receipt from an earlier run of the output host carries another epoch;
a forged one fails the signature.

In a cluster a receipt starts with the issuing output host's tag and a dot
(``tag.signed~index``), so that a frontend can send its settlement to that host
(``tag_of``); the signature does not cover the tag (a receipt with another tag goes to
another host, whose key it fails)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import struct
from collections.abc import Iterable, Sequence
from typing import Any

_BATCH = struct.Struct(">IQH")  # epoch, first delivery number, count
_MAC_SIZE = 10
_SIGNED_LEN = 32  # base64 of the 24 bytes above and the MAC, unpadded
_MAX_RUN = 0xFFFF
MAX_RECEIPT = 64


def host_tag(host_id: str) -> str:
    """The receipt tag of an output host: its id's random part."""
    return host_id.rsplit("-", 1)[-1]


def tag_of(receipt: str) -> str:
    """The tag of the output host that issued a receipt ("" when it has none)."""
    tag, dot, _ = receipt.partition(".")
    return tag if dot else ""


def runs(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """``numbers`` as (first, count) runs of consecutive numbers, in order."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(numbers)
    while i < n:
        first = numbers[i]
        j = i + 1
        while j < n and numbers[j] == first + (j - i) and j - i < _MAX_RUN:
            j += 1
        out.append((first, j - i))
        i = j
    return out


def _canonical(index: str) -> bool:
    """A batch index as sign_all writes it: ASCII digits, no leading zero."""
    return (
        0 < len(index) <= 5 and index.isascii() and index.isdigit()
        and (index[0] != "0" or index == "0")
    )  # fmt: skip


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

    def sign_all(self, scope: bytes, numbers: Sequence[int]) -> list[str]:
        """Receipts of the deliveries ``numbers`` (in order), one signature for each run
        of consecutive numbers (a receive's batch is one run)."""
        out: list[str] = []
        for first, count in runs(numbers):
            body = _BATCH.pack(self.epoch, first, count)
            signed = base64.urlsafe_b64encode(body + self._mac(scope, body)).decode()
            head = f"{self._prefix}{signed}~"
            out.extend([head + str(i) for i in range(count)])
        return out

    def sign(self, scope: bytes, delivery_no: int) -> str:
        return self.sign_all(scope, [delivery_no])[0]

    def verify_all(self, scope: bytes, receipts: Iterable[str]) -> list[int | None]:
        """The delivery number each receipt names, or None for one that is not ours or
        not for this scope or this epoch."""
        checked: dict[str, tuple[int, int] | None] = {}  # signed part -> (first, count)
        out: list[int | None] = []
        for receipt in receipts:
            if not isinstance(receipt, str) or len(receipt) > MAX_RECEIPT:
                out.append(None)
                continue
            signed, tilde, index = receipt.rpartition("~")
            if not tilde or not _canonical(index):
                out.append(None)
                continue
            if signed in checked:
                batch = checked[signed]
            else:
                batch = checked[signed] = self._check(scope, signed)
            i = int(index)
            out.append(batch[0] + i if batch is not None and i < batch[1] else None)
        return out

    def verify(self, scope: bytes, receipt: str) -> int | None:
        return self.verify_all(scope, [receipt])[0]

    def _check(self, scope: bytes, signed: str) -> tuple[int, int] | None:
        """The (first, count) a signed part names, or None when it is not ours."""
        prefix = self._prefix
        if not signed.startswith(prefix) or tag_of(signed) != prefix[:-1]:
            return None
        signed = signed[len(prefix) :]
        if len(signed) != _SIGNED_LEN:
            return None
        try:
            raw = base64.urlsafe_b64decode(signed)
        except (binascii.Error, ValueError):
            return None
        body, mac = raw[: _BATCH.size], raw[_BATCH.size :]
        if not secrets.compare_digest(mac, self._mac(scope, body)):
            return None
        epoch, first, count = _BATCH.unpack(body)
        return (first, count) if epoch == self.epoch else None
