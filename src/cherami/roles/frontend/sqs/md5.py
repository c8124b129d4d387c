"""The MD5 digests SQS answers with, computed exactly as SQS computes them, which the
SDKs that check them (Java, .NET, Go v1) compare with their own:

- ``MD5OfMessageBody`` / ``MD5OfBody``: of the body's UTF-8 bytes;
- ``MD5OfMessageAttributes`` (and ``MD5OfMessageSystemAttributes``): over the
  attributes sorted by name, each as its name, its data type (4-byte big-endian length,
  then the UTF-8 bytes of each), one transport byte (1: a string value, 2: binary), and
  the value (length, then its bytes)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

from cherami.roles.frontend.sqs.model import AttributeValue

STRING_TRANSPORT = 1
BINARY_TRANSPORT = 2


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _field(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def md5_of_attributes(attributes: Mapping[str, AttributeValue]) -> str | None:
    """The digest of message (or message system) attributes; None when there are none
    (SQS then leaves the field out)."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        digest.update(_field(name.encode("utf-8")))
        digest.update(_field(value.data_type.encode("utf-8")))
        if value.binary is not None:
            digest.update(bytes([BINARY_TRANSPORT]) + _field(value.binary))
        else:
            digest.update(bytes([STRING_TRANSPORT]) + _field((value.string or "").encode("utf-8")))
    return digest.hexdigest()
