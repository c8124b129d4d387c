"""SQS's message actions: send (one or a batch), receive with long polling, delete and
change visibility (one or a batch). A receipt handle is the Cherami receipt of the
delivery; a delete is an ack, a visibility change an extension, or a nack at once for
0 (the message is visible again, as in SQS)."""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass
from typing import Any

from cherami.errors import CheramiError, QueueNotFound
from cherami.metadata.models import Group, Queue
from cherami.roles.frontend.auth import Scope
from cherami.roles.frontend.sqs import fifo as f
from cherami.roles.frontend.sqs import model
from cherami.roles.frontend.sqs.attributes import MIN_VISIBILITY
from cherami.roles.frontend.sqs.backend import Backend
from cherami.roles.frontend.sqs.errors import (
    SqsError,
    bad_receipt,
    batch,
    from_cherami,
    invalid,
    missing,
    no_queue,
)
from cherami.roles.frontend.sqs.md5 import md5_of_attributes, md5_of_body
from cherami.roles.frontend.sqs.queues import Caller, integer, queue_name, strings
from cherami.roles.frontend.sqs.settings import SettingsStore
from cherami.roles.outputhost.client import Settlement
from cherami.wire.records import Message

MAX_BATCH = 10
ANONYMOUS = "anonymous"
MAX_BATCH_BYTES = 1 << 20  # a batch's bodies and attributes together (SQS: 1 MiB)
MAX_DELAY = 30 * 86400  # Cherami's (SQS's is 900 s)
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_SYSTEM_NAMES = ("All", "SenderId", "SentTimestamp", "ApproximateReceiveCount",
                 "ApproximateFirstReceiveTimestamp", "AWSTraceHeader",
                 *f.SYSTEM_NAMES)  # fmt: skip
VISIBILITY_GONE = ("Value {} for parameter ReceiptHandle is invalid. Reason: Message does not "
                   "exist or is not available for visibility timeout change.")  # fmt: skip


@dataclass
class Built:
    message: Message
    result: dict[str, Any]  # MD5s
    size: int


def build(
    entry: dict[str, Any], queue: Queue, sender: str, fifo: dict[str, str] | None = None
) -> Built:
    """A send's message, checked as SQS checks it, and the MD5s its answer carries;
    ``fifo``: a FIFO queue's attributes (fifo.py)."""
    body = model.check_body(entry.get("MessageBody"))
    attributes = model.parse_attributes(entry.get("MessageAttributes"))
    system = model.parse_attributes(entry.get("MessageSystemAttributes"), system=True)
    key = dedup_id = None
    fifo_attributes: dict[str, str] = {}
    if fifo is not None:
        key, dedup_id, fifo_attributes = f.message_fields(entry, fifo, body)
    elif entry.get("MessageDeduplicationId"):
        raise invalid("The request includes a parameter that is not valid for this queue type: "
                      "MessageDeduplicationId (FIFO queues only).")  # fmt: skip
    delay = entry.get("DelaySeconds")
    delay_ms = None if delay is None else integer("DelaySeconds", delay, 0, MAX_DELAY) * 1000
    data = body.encode("utf-8")
    size = len(data) + sum(v.size(n) for n, v in attributes.items())
    limit = queue.config.max_message_bytes
    if size > limit:
        raise invalid(f"One or more parameters are invalid. Reason: Message must be shorter "
                      f"than {limit} bytes.")  # fmt: skip
    stored = model.to_cherami(attributes, system)
    stored[model.SYSTEM_PREFIX + "SenderId"] = sender
    stored.update(fifo_attributes)
    result: dict[str, Any] = {"MD5OfMessageBody": md5_of_body(body)}
    if (digest := md5_of_attributes(attributes)) is not None:
        result["MD5OfMessageAttributes"] = digest
    if (digest := md5_of_attributes(system)) is not None:
        result["MD5OfMessageSystemAttributes"] = digest
    message = Message(data, stored, delay_ms, None, True, dedup_id, key)
    return Built(message, result, size)


def check_entries(entries: Any) -> list[dict[str, Any]]:
    if not entries:
        raise batch("EmptyBatchRequest", "There should be at least one entry in the request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid("Entries must be a list of structures.")
    if len(entries) > MAX_BATCH:
        raise batch(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are 10. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.get("Id")
        if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id):
            raise batch(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise batch("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failed(entry_id: str, err: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": err.sender, "Code": err.code, "Message": err.message}


def _looks_like_receipt(receipt: Any) -> bool:
    return isinstance(receipt, str) and 0 < len(receipt) <= 64 and "~" in receipt


class MessageActions:
    def __init__(self, backend: Backend, settings: SettingsStore) -> None:
        self.backend = backend
        self.settings = settings
        self.sequence = f.SequenceNumbers(backend.r.metadata)

    async def _fifo(self, queue: Queue) -> dict[str, str] | None:
        """A FIFO queue's attributes (None: a standard queue; only a ``.fifo`` name is
        looked up, so a standard queue's send reads nothing more)."""
        if not f.is_fifo(queue.name):
            return None
        settings = await self.settings.get(queue.name)
        return settings.fifo if settings.is_fifo else None

    async def _target(self, c: Caller, p: dict[str, Any], scope: Scope) -> tuple[Queue, Group]:
        name = queue_name(p)
        c.allow(scope, name)
        found = await self.backend.find(name)
        if found is None:
            raise no_queue(name)
        return found

    async def _group(self, c: Caller, p: dict[str, Any]) -> Group:
        """The queue's ``sqs`` group, for the consuming actions (one metadata read)."""
        name = queue_name(p)
        c.allow("consume", name)
        try:
            return await self.backend.group(name)
        except QueueNotFound:
            raise no_queue(name) from None

    async def SendMessage(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        queue, _ = await self._target(c, p, "produce")
        fifo = await self._fifo(queue)
        built = build(p, queue, c.sender, fifo)
        (msg_id,) = await self.backend.publish(queue, [built.message], c.key)
        if fifo is not None:  # a repeat within the dedup window: the first send's id
            built.result["SequenceNumber"] = await self.sequence.of(msg_id)
        return {"MessageId": msg_id, **built.result}

    async def SendMessageBatch(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        queue, _ = await self._target(c, p, "produce")
        entries = check_entries(p.get("Entries"))
        fifo = await self._fifo(queue)
        good: list[tuple[str, Built]] = []
        bad: list[dict[str, Any]] = []
        for entry in entries:
            try:
                good.append((entry["Id"], build(entry, queue, c.sender, fifo)))
            except SqsError as err:
                bad.append(failed(entry["Id"], err))
        total = sum(b.size for _, b in good)
        if total > MAX_BATCH_BYTES:
            raise batch("BatchRequestTooLong", f"Batch requests cannot be longer than "
                        f"{MAX_BATCH_BYTES} bytes. You have sent {total} bytes.")  # fmt: skip
        done: list[dict[str, Any]] = []
        if good:
            ids = await self.backend.publish(queue, [b.message for _, b in good], c.key)
            if fifo is not None:
                for (_, b), msg_id in zip(good, ids, strict=True):
                    b.result["SequenceNumber"] = await self.sequence.of(msg_id)
            done = [
                {"Id": i, "MessageId": m, **b.result} for (i, b), m in zip(good, ids, strict=True)
            ]
        return {"Successful": done, "Failed": bad}

    async def ReceiveMessage(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        group = await self._group(c, p)
        most = integer("MaxNumberOfMessages", p.get("MaxNumberOfMessages", 1), 1, 10)
        wait = p.get("WaitTimeSeconds")
        if wait is None:
            wait = (await self.settings.get(group.queue)).wait_seconds
        wait = integer("WaitTimeSeconds", wait, 0, 20)
        visibility = p.get("VisibilityTimeout")
        seconds = None
        if visibility is not None:
            seconds = float(integer("VisibilityTimeout", visibility, 0, 43200)) or MIN_VISIBILITY
        system_names = [
            *strings(p, "AttributeNames"),
            *strings(p, "MessageSystemAttributeNames"),
        ]
        for name in system_names:
            if name not in _SYSTEM_NAMES:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        wanted = strings(p, "MessageAttributeNames")
        f.check_attempt_id(p.get("ReceiveRequestAttemptId"))  # taken, not used (docs/sqs.md)
        deliveries = await self.backend.receive(group, most, float(wait), seconds)
        now_ms = int(time.time() * 1000)
        messages = [self._message(d, system_names, wanted, c, now_ms) for d in deliveries]
        if f.is_fifo(group.queue) and {"All", "SequenceNumber"} & set(system_names):
            for d, m in zip(deliveries, messages, strict=True):
                if model.SYSTEM_PREFIX + "MessageGroupId" in d.attributes:  # sent through SQS
                    number = await self.sequence.of(d.msg_id)
                    m.setdefault("Attributes", {})["SequenceNumber"] = number
        return {"Messages": messages} if messages else {}

    def _message(
        self, d: model.Delivery, system_names: list[str], wanted: list[str], c: Caller, now: int
    ) -> dict[str, Any]:
        try:
            body = d.body.decode("utf-8")
        except UnicodeDecodeError:  # published as bytes through the HTTP API
            body = base64.b64encode(d.body).decode()
        attributes, stored_system = model.from_cherami(d.attributes)
        system: dict[str, str] = {
            "SenderId": ANONYMOUS,  # published without one (the HTTP API)
            "SentTimestamp": str(d.enqueued_ms),
            "ApproximateReceiveCount": str(d.count),
            # not stored: the time of this receive, for a first one; else the sent time
            "ApproximateFirstReceiveTimestamp": str(now if d.count <= 1 else d.enqueued_ms),
            **stored_system,
        }
        out: dict[str, Any] = {"MessageId": d.msg_id, "ReceiptHandle": d.receipt,
                               "MD5OfBody": md5_of_body(body), "Body": body}  # fmt: skip
        if chosen := model.selected(system_names, system):
            out["Attributes"] = chosen
        if chosen_attributes := model.selected(wanted, attributes):
            out["MessageAttributes"] = {n: v.json() for n, v in chosen_attributes.items()}
            out["MD5OfMessageAttributes"] = md5_of_attributes(chosen_attributes)
        return out

    async def _settle(self, group: Group, receipts: list[str], how: Settlement) -> list[str]:
        """The stale receipts among those settled."""
        try:
            _, stale = await self.backend.settle(group, receipts, how)
        except CheramiError as err:
            raise from_cherami(err) from None
        return stale

    async def DeleteMessage(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        group = await self._group(c, p)
        receipt = p.get("ReceiptHandle")
        if not receipt:
            raise missing("ReceiptHandle")
        if not _looks_like_receipt(receipt):
            raise bad_receipt(str(receipt))
        await self._settle(group, [receipt], Settlement("ack"))  # a stale one: done already
        return {}

    async def DeleteMessageBatch(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        group = await self._group(c, p)
        entries = check_entries(p.get("Entries"))
        bad = [failed(e["Id"], bad_receipt(str(e.get("ReceiptHandle"))))
               for e in entries if not _looks_like_receipt(e.get("ReceiptHandle"))]  # fmt: skip
        failed_ids = {f["Id"] for f in bad}
        good = [e for e in entries if e["Id"] not in failed_ids]
        if good:
            await self._settle(group, [e["ReceiptHandle"] for e in good], Settlement("ack"))
        return {"Successful": [{"Id": e["Id"]} for e in good], "Failed": bad}

    async def ChangeMessageVisibility(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        group = await self._group(c, p)
        receipt = p.get("ReceiptHandle")
        if not receipt:
            raise missing("ReceiptHandle")
        if "VisibilityTimeout" not in p:
            raise missing("VisibilityTimeout")
        if not _looks_like_receipt(receipt):
            raise bad_receipt(str(receipt))
        seconds = integer("VisibilityTimeout", p["VisibilityTimeout"], 0, 43200)
        if await self._settle(group, [receipt], _visibility(seconds)):
            raise invalid(VISIBILITY_GONE.format(receipt))
        return {}

    async def ChangeMessageVisibilityBatch(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        group = await self._group(c, p)
        entries = check_entries(p.get("Entries"))
        done: list[dict[str, Any]] = []
        bad: list[dict[str, Any]] = []
        for entry in entries:  # each its own timeout: settled one by one
            receipt = entry.get("ReceiptHandle")
            try:
                if not _looks_like_receipt(receipt):
                    raise bad_receipt(str(receipt))
                seconds = integer("VisibilityTimeout", entry.get("VisibilityTimeout"), 0, 43200)
                if await self._settle(group, [str(receipt)], _visibility(seconds)):
                    raise invalid(VISIBILITY_GONE.format(receipt))
                done.append({"Id": entry["Id"]})
            except SqsError as err:
                bad.append(failed(entry["Id"], err))
        return {"Successful": done, "Failed": bad}


def _visibility(seconds: int) -> Settlement:
    """0: visible again now (a nack without delay); else an extension from now."""
    return Settlement("extend", float(seconds)) if seconds else Settlement("nack", 0.0)
