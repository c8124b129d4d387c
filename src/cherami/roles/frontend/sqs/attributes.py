"""Queue attributes, SQS's names over Cherami's settings:

| SQS | Cherami |
|---|---|
| DelaySeconds | the queue's ``delay_seconds`` (up to 30 days, beyond SQS's 900 s) |
| MessageRetentionPeriod | the queue's ``retention_seconds`` |
| MaximumMessageSize | the queue's ``max_message_bytes`` |
| VisibilityTimeout | the ``sqs`` group's ``visibility_timeout_seconds`` |
| RedrivePolicy ``maxReceiveCount`` | the group's ``max_delivery_count`` (1000 without one) |
| RedrivePolicy ``deadLetterTargetArn`` | kept (settings.py); messages go to the group's DLQ |
| ReceiveMessageWaitTimeSeconds, Policy, Kms*, SqsManagedSseEnabled | kept |
| RedriveAllowPolicy | kept; checked against a source's RedrivePolicy |
| FifoQueue, ContentBasedDeduplication, DeduplicationScope, FifoThroughputLimit | fifo.py |"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cherami.metadata.models import Group, Queue
from cherami.roles.frontend.sqs import fifo as f
from cherami.roles.frontend.sqs.errors import SqsError, bad_attribute_name, bad_attribute_value
from cherami.roles.frontend.sqs.settings import QueueSettings

ACCOUNT = "000000000000"
NO_REDRIVE_COUNT = 1000  # Cherami's most deliveries; SQS without a RedrivePolicy has none
MIN_VISIBILITY = 0.001  # Cherami needs a visibility timeout above 0
KEPT = ("Policy", "RedriveAllowPolicy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
        "SqsManagedSseEnabled")  # fmt: skip
FIFO_ONLY = f.ATTRIBUTES
READ_ONLY = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
             "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp", "LastModifiedTimestamp",
             "QueueArn")  # fmt: skip
SETTABLE = (
    "DelaySeconds", "MaximumMessageSize", "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds", "VisibilityTimeout", "RedrivePolicy", *KEPT,
)  # fmt: skip
_UNSET = object()


def arn(name: str, region: str) -> str:
    return f"arn:aws:sqs:{region}:{ACCOUNT}:{name}"


def name_of_arn(value: Any, parameter: str) -> str:
    if not isinstance(value, str) or not value.startswith("arn:") or value.count(":") < 5:
        raise SqsError(
            "InvalidParameterValue", f"Value {value!r} for parameter {parameter} is invalid."
        )
    return value.rsplit(":", 1)[1]


@dataclass
class Wanted:
    """What a CreateQueue's or SetQueueAttributes' attributes ask for."""

    queue: dict[str, Any] = field(default_factory=dict)  # QueueConfig fields
    group: dict[str, Any] = field(default_factory=dict)  # GroupConfig fields
    wait_seconds: int | None = None
    dead_letter_target: Any = _UNSET  # a queue name, None (no redrive) or _UNSET
    kept: dict[str, str] = field(default_factory=dict)
    fifo: dict[str, str] = field(default_factory=dict)  # a FIFO queue's FIFO attributes

    def apply(self, settings: QueueSettings) -> QueueSettings:
        if self.wait_seconds is not None:
            settings.wait_seconds = self.wait_seconds
        if self.dead_letter_target is not _UNSET:
            settings.dead_letter_target = self.dead_letter_target
        settings.kept.update(self.kept)
        settings.fifo.update(self.fifo)
        return settings


def _int(name: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise bad_attribute_value(name, f"Reason: {value!r} is not an integer.") from None
    if not low <= number <= high:
        raise bad_attribute_value(name, f"Reason: must be between {low} and {high}.")
    return number


def wants_fifo(attributes: Any) -> bool:
    """A CreateQueue's FifoQueue (false without it)."""
    if not isinstance(attributes, dict) or "FifoQueue" not in attributes:
        return False
    value = str(attributes["FifoQueue"]).lower()
    if value not in ("true", "false"):
        raise bad_attribute_value("FifoQueue", "Reason: must be true or false.")
    return value == "true"


def parse(attributes: Any, creating: bool, fifo: bool = False) -> Wanted:
    """``fifo``: the queue is (or is being made) a FIFO queue."""
    if attributes is None:
        return Wanted()
    if not isinstance(attributes, dict):
        raise SqsError("InvalidParameterValue", "Attributes must be a map of name to value.")
    wanted = Wanted()
    for name, value in attributes.items():
        if name == "FifoQueue" and creating:
            continue  # wants_fifo read it
        if name in FIFO_ONLY:
            if not fifo or name == "FifoQueue":  # set once, by CreateQueue
                raise bad_attribute_name(name)
            wanted.fifo[name] = f.attribute(name, value)
            continue
        if name not in SETTABLE:
            raise bad_attribute_name(name)
        if name == "DelaySeconds":
            wanted.queue["delay_seconds"] = float(_int(name, value, 0, 30 * 86400))
        elif name == "MaximumMessageSize":
            wanted.queue["max_message_bytes"] = _int(name, value, 1024, 8 << 20)
        elif name == "MessageRetentionPeriod":
            wanted.queue["retention_seconds"] = float(_int(name, value, 60, 365 * 86400))
        elif name == "ReceiveMessageWaitTimeSeconds":
            wanted.wait_seconds = _int(name, value, 0, 20)
        elif name == "VisibilityTimeout":
            seconds = _int(name, value, 0, 43200)
            wanted.group["visibility_timeout_seconds"] = float(seconds) or MIN_VISIBILITY
        elif name == "RedrivePolicy":
            _redrive(wanted, value)
        elif name == "RedriveAllowPolicy":
            if value not in ("", None):
                allowed_sources(str(value))  # checked now, applied to the sources' policies
            wanted.kept[name] = str(value)
        else:
            wanted.kept[name] = str(value)
    return wanted


def _redrive(wanted: Wanted, value: Any) -> None:
    if value in ("", None, "{}"):
        wanted.group["max_delivery_count"] = NO_REDRIVE_COUNT
        wanted.dead_letter_target = None
        return
    try:
        policy = json.loads(value) if isinstance(value, str) else value
        target = name_of_arn(policy["deadLetterTargetArn"], "RedrivePolicy")
        count = _int("RedrivePolicy", policy["maxReceiveCount"], 1, 1000)
    except (ValueError, TypeError, KeyError):
        raise bad_attribute_value(
            "RedrivePolicy", "Reason: Redrive policy is not a valid JSON map with "
            "deadLetterTargetArn and maxReceiveCount.",
        ) from None  # fmt: skip
    wanted.group["max_delivery_count"] = count
    wanted.dead_letter_target = target


def allowed_sources(policy: str | None) -> list[str] | None:
    """The queues (by name) a dead-letter queue's RedriveAllowPolicy lets name it as
    their target; None: any queue (``allowAll``, or no policy)."""
    if not policy:
        return None
    why = ("Reason: RedriveAllowPolicy must be a JSON map with redrivePermission allowAll, "
           "denyAll or byQueue, and sourceQueueArns (1 to 10) with byQueue only.")  # fmt: skip
    try:
        parsed = json.loads(policy)
        permission = parsed["redrivePermission"]
        arns = parsed.get("sourceQueueArns")
    except (ValueError, TypeError, KeyError):
        raise bad_attribute_value("RedriveAllowPolicy", why) from None
    if permission == "byQueue" and isinstance(arns, list) and 1 <= len(arns) <= 10:
        return [name_of_arn(arn, "RedriveAllowPolicy") for arn in arns]
    if permission in ("allowAll", "denyAll") and arns is None:
        return None if permission == "allowAll" else []
    raise bad_attribute_value("RedriveAllowPolicy", why)


def redrive_policy(group: Group, settings: QueueSettings, region: str) -> str | None:
    if settings.dead_letter_target is None:
        return None
    return json.dumps({
        "deadLetterTargetArn": arn(settings.dead_letter_target, region),
        "maxReceiveCount": group.config.max_delivery_count,
    }, separators=(",", ":"))  # fmt: skip


def render(
    queue: Queue,
    group: Group,
    settings: QueueSettings,
    counts: tuple[int, int, int] | None,
    names: list[str],
    region: str,
) -> dict[str, str]:
    """The attributes GetQueueAttributes asks for (``All``, or by name)."""
    want = set(names)
    every = "All" in want
    for name in want - {"All"}:
        if name not in SETTABLE and name not in READ_ONLY and name not in FIFO_ONLY:
            raise bad_attribute_name(name)
    config, gconfig = queue.config, group.config
    visible, in_flight, delayed = counts or (0, 0, 0)
    values: dict[str, str | None] = {
        "QueueArn": arn(queue.name, region),
        "ApproximateNumberOfMessages": str(visible),
        "ApproximateNumberOfMessagesNotVisible": str(in_flight),
        "ApproximateNumberOfMessagesDelayed": str(delayed),
        "CreatedTimestamp": str(int(queue.created_at)),
        "LastModifiedTimestamp": str(int(settings.modified or queue.created_at)),
        "VisibilityTimeout": str(round(gconfig.visibility_timeout_seconds)),
        "MaximumMessageSize": str(config.max_message_bytes),
        "MessageRetentionPeriod": str(round(config.retention_seconds)),
        "DelaySeconds": str(round(config.delay_seconds)),
        "ReceiveMessageWaitTimeSeconds": str(settings.wait_seconds),
        "RedrivePolicy": redrive_policy(group, settings, region),
        "SqsManagedSseEnabled": "false",
        **settings.kept,
        **settings.fifo,
    }
    return {
        name: value
        for name, value in values.items()
        if value is not None and (every or name in want)
    }


def needs_counts(names: list[str]) -> bool:
    return "All" in names or any(n.startswith("ApproximateNumber") for n in names)
