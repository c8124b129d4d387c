"""SQS's message attributes, read from a request and kept in a Cherami message's
string-to-string attributes, so that a native consumer sees them too:

- a ``String`` attribute is kept as itself (``name -> value``);
- any other type (``Number``, ``Binary``, ``String.custom``…) keeps its value (Binary
  in base64) and its type under ``sqs:type:<name>``;
- a message system attribute (``AWSTraceHeader``) is kept under ``sqs:sys:<name>``, and
  so is the sender's access key id (``sqs:sys:SenderId``).

``:`` never appears in an SQS attribute name, so these keys cannot collide with one.
A native publish's attributes come back to SQS as ``String`` attributes."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from cherami.roles.frontend.sqs.errors import SqsError, invalid

TYPE_PREFIX = "sqs:type:"
SYSTEM_PREFIX = "sqs:sys:"
MAX_ATTRIBUTES = 10
_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_\-.]{0,255}$")
_RESERVED = ("aws.", "amazon.")
SYSTEM_ATTRIBUTES = ("AWSTraceHeader",)


@dataclass(frozen=True)
class Delivery:
    """A message as a receive delivered it."""

    msg_id: str
    receipt: str
    body: bytes
    attributes: dict[str, str]
    count: int  # ApproximateReceiveCount
    enqueued_ms: int  # SentTimestamp


@dataclass(frozen=True)
class AttributeValue:
    data_type: str
    string: str | None = None
    binary: bytes | None = None

    def json(self) -> dict[str, Any]:
        """As the JSON protocol writes it (binary in base64)."""
        out: dict[str, Any] = {"DataType": self.data_type}
        if self.binary is not None:
            out["BinaryValue"] = base64.b64encode(self.binary).decode()
        else:
            out["StringValue"] = self.string or ""
        return out

    def size(self, name: str) -> int:
        """What it counts towards the message size limit: name, type and value."""
        value = self.binary if self.binary is not None else (self.string or "").encode()
        return len(name.encode()) + len(self.data_type.encode()) + len(value)


def parse_attributes(raw: Any, system: bool = False) -> dict[str, AttributeValue]:
    """The MessageAttributes (or MessageSystemAttributes) of a send, checked as SQS
    checks them; InvalidParameterValue naming what is wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid("MessageAttributes must be a map of name to value")
    kind = "system attribute" if system else "attribute"
    if len(raw) > MAX_ATTRIBUTES:
        raise invalid(f"Number of message {kind}s [{len(raw)}] exceeds the allowed maximum [10].")
    out: dict[str, AttributeValue] = {}
    for name, value in raw.items():
        if system and name not in SYSTEM_ATTRIBUTES:
            raise invalid(f"Message system attribute name '{name}' is invalid.")
        if not system and (
            not _NAME.match(name) or name.lower().startswith(_RESERVED) or ".." in name
            or name.endswith(".")
        ):  # fmt: skip
            raise invalid(f"Message (user) attribute name '{name}' is invalid.")
        out[name] = _value(name, value, kind)
    return out


def _value(name: str, raw: Any, kind: str) -> AttributeValue:
    if not isinstance(raw, dict):
        raise invalid(f"The message {kind} '{name}' must be a structure.")
    data_type = raw.get("DataType")
    if not isinstance(data_type, str) or not data_type:
        raise invalid(
            f"The message {kind} '{name}' must contain a non-empty message attribute type."
        )
    base = data_type.split(".", 1)[0]
    if base not in ("String", "Number", "Binary"):
        raise invalid(f"The type of message {kind} '{name}' is invalid. You must use only the "
                      "following supported type prefixes: Binary, Number, String.")  # fmt: skip
    if base == "Binary":
        binary = raw.get("BinaryValue")
        if isinstance(binary, str):
            try:
                binary = base64.b64decode(binary, validate=True)
            except (binascii.Error, ValueError):
                raise invalid(f"The message {kind} '{name}' has invalid base64.") from None
        if not isinstance(binary, bytes) or not binary:
            raise invalid(f"The message {kind} '{name}' must contain a non-empty value of "
                          "message attribute type 'Binary'.")  # fmt: skip
        return AttributeValue(data_type, binary=binary)
    string = raw.get("StringValue")
    if not isinstance(string, str) or not string:
        raise invalid(f"The message {kind} '{name}' must contain a non-empty value of "
                      f"message attribute type '{base}'.")  # fmt: skip
    if base == "Number":
        try:
            Decimal(string)
        except InvalidOperation:
            raise invalid(f"Can't cast the value of message {kind} '{name}' to a number.") from None
    return AttributeValue(data_type, string=string)


def to_cherami(
    attributes: dict[str, AttributeValue], system: dict[str, AttributeValue]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in attributes.items():
        if value.binary is not None:
            out[name] = base64.b64encode(value.binary).decode()
        else:
            out[name] = value.string or ""
        if value.data_type != "String":
            out[TYPE_PREFIX + name] = value.data_type
    for name, value in system.items():
        out[SYSTEM_PREFIX + name] = value.string or ""
    return out


def from_cherami(stored: dict[str, str]) -> tuple[dict[str, AttributeValue], dict[str, str]]:
    """The message attributes, and the system attributes, of a stored message."""
    attributes: dict[str, AttributeValue] = {}
    system: dict[str, str] = {}
    for name, value in stored.items():
        if name.startswith(SYSTEM_PREFIX):
            system[name[len(SYSTEM_PREFIX) :]] = value
        elif not name.startswith(TYPE_PREFIX):
            data_type = stored.get(TYPE_PREFIX + name, "String")
            if data_type.startswith("Binary"):
                try:
                    attributes[name] = AttributeValue(data_type, binary=base64.b64decode(value))
                    continue
                except (binascii.Error, ValueError):
                    data_type = "String"
            attributes[name] = AttributeValue(data_type, string=value)
    return attributes, system


def selected(names: list[str], attributes: dict[str, Any]) -> dict[str, Any]:
    """The attributes a receive asked for: ``All`` or ``.*``, names, or ``prefix.*``."""
    if not names:
        return {}
    if "All" in names or ".*" in names:
        return dict(attributes)
    out = {}
    for name, value in attributes.items():
        for want in names:
            if want == name or (want.endswith(".*") and name.startswith(want[:-1])):
                out[name] = value
                break
    return out


def check_body(body: Any) -> str:
    """A message body SQS would take: non-empty text of the allowed characters."""
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    if _BAD_CHARS.search(body):
        raise SqsError(
            "InvalidMessageContents",
            "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | "
            "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF",
        )
    return body


_BAD_CHARS = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
