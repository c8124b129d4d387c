"""SQS's queue actions: create, find, list, delete and purge queues; their attributes
and tags; dead-letter sources and message move tasks (movetasks.py)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from cherami.errors import InvalidName, QueueNotFound
from cherami.metadata.models import GroupConfig, Queue, QueueConfig, check_name
from cherami.roles.frontend.auth import ApiKey, Scope
from cherami.roles.frontend.sqs import attributes as a
from cherami.roles.frontend.sqs import fifo as f
from cherami.roles.frontend.sqs.backend import Backend
from cherami.roles.frontend.sqs.errors import (
    SqsError,
    bad_attribute_value,
    invalid,
    missing,
    no_queue,
    not_found,
    queue_exists,
)
from cherami.roles.frontend.sqs.movetasks import MoveTasks, as_sqs, parse_handle
from cherami.roles.frontend.sqs.settings import QueueSettings, SettingsStore, clone

SQS_DEFAULT_VISIBILITY = 30.0
SQS_DEFAULT_RETENTION = 4 * 86400.0
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
MAX_MOVE_RATE = 500  # MaxNumberOfMessagesPerSecond, as SQS's


@dataclass
class Caller:
    """Who asks, and how they reached this endpoint."""

    allow: Callable[[Scope | None, str | None], None]  # raises AccessDenied
    region: str
    base_url: str  # scheme://host:port the client used
    key: ApiKey | None = None
    sender: str = "anonymous"  # SenderId: the access key id

    def url(self, name: str) -> str:
        return f"{self.base_url}/{a.ACCOUNT}/{name}"


def queue_name(params: dict[str, Any]) -> str:
    url = params.get("QueueUrl")
    if not isinstance(url, str) or not url:
        raise missing("QueueUrl")
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise SqsError("InvalidAddress", f"The address {url} is not valid for this endpoint.", 404)
    return name


@dataclass
class QueueActions:
    backend: Backend
    settings: SettingsStore
    tasks: MoveTasks

    async def find(self, name: str) -> tuple[Queue, Any]:
        found = await self.backend.find(name)
        if found is None:
            raise no_queue(name)
        return found

    async def CreateQueue(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = p.get("QueueName")
        if not isinstance(name, str) or not name:
            raise missing("QueueName")
        fifo = a.wants_fifo(p.get("Attributes"))
        f.check_name(name, fifo)
        if not fifo and not _QUEUE_NAME.match(name):
            raise invalid("Can only include alphanumeric characters, hyphens, or underscores. "
                          "1 to 80 in length")  # fmt: skip
        try:
            check_name("queue", name)
        except InvalidName as err:
            raise invalid(
                f"{err.message} (a Cherami queue name starts with a letter or digit)"
            ) from None
        c.allow("admin", name)
        wanted = a.parse(p.get("Attributes"), creating=True, fifo=fifo)
        if fifo:
            wanted.fifo = {**f.DEFAULTS, **wanted.fifo}
            f.check_combination(wanted.fifo)
        tags = _tags(p.get("tags", p.get("Tags")))
        await self._check_target(name, wanted)
        found = await self.backend.find(name)
        if found is not None:
            queue, group = found
            settings = await self.settings.get(name)
            same = _matches(queue.config, wanted.queue) and _matches(group.config, wanted.group)
            if not same or wanted.apply(clone(settings)) != settings:
                raise queue_exists(name)
            return {"QueueUrl": c.url(name)}
        gconfig = GroupConfig(
            visibility_timeout_seconds=SQS_DEFAULT_VISIBILITY,
            max_delivery_count=a.NO_REDRIVE_COUNT,
        )
        gconfig = msgspec.structs.replace(gconfig, **wanted.group)
        try:  # a queue made by the HTTP API becomes an SQS queue by getting the group
            queue = await self.backend.r.metadata.get_queue(name)
        except QueueNotFound:
            fifo_config = f.QUEUE_CONFIG if fifo else {}  # one open CP extent; 5-min dedup
            config = QueueConfig(**{"retention_seconds": SQS_DEFAULT_RETENTION, **fifo_config,
                                    **wanted.queue})  # fmt: skip
        else:
            if not _matches(queue.config, wanted.queue):
                raise queue_exists(name)
            config = queue.config
        await self.backend.create(name, config, gconfig)
        before = await self.settings.get(name)  # none, unless an older queue left some
        settings = wanted.apply(QueueSettings())
        settings.tags = tags
        await self.settings.put(name, before, settings)
        return {"QueueUrl": c.url(name)}

    async def _check_target(self, source: str, wanted: a.Wanted) -> None:
        """The RedrivePolicy's target exists, and its RedriveAllowPolicy lets this
        queue name it."""
        target = wanted.dead_letter_target
        if not isinstance(target, str):
            return
        if await self.backend.find(target) is None:
            raise bad_attribute_value("RedrivePolicy", "Reason: Dead letter target does not exist.")
        if f.is_fifo(target) != f.is_fifo(source):  # as SQS: a FIFO queue's DLQ is FIFO
            raise bad_attribute_value("RedrivePolicy", "Reason: Dead-letter queue must be "
                                      "same type of queue as the source.")  # fmt: skip
        policy = (await self.settings.get(target)).kept.get("RedriveAllowPolicy")
        allowed = a.allowed_sources(policy)
        if allowed is not None and source not in allowed:
            raise bad_attribute_value("RedrivePolicy", "Reason: The dead letter target's "
                                      "RedriveAllowPolicy does not allow this queue.")  # fmt: skip

    async def GetQueueUrl(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = p.get("QueueName")
        if not isinstance(name, str) or not name:
            raise missing("QueueName")
        c.allow(None, name)
        await self.find(name)
        return {"QueueUrl": c.url(name)}

    async def ListQueues(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        c.allow(None, None)
        prefix = p.get("QueueNamePrefix") or ""
        limit = p.get("MaxResults")
        if limit is not None:
            limit = integer("MaxResults", limit, 1, 1000)
        after = _after(p.get("NextToken"))
        names = await self.backend.names(str(prefix), after, (limit or 1000) + 1)
        return _page(c, "QueueUrls", names, limit)

    async def DeleteQueue(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow("admin", name)
        await self.find(name)
        await self.backend.delete(name)  # its properties (the settings) with it
        return {}

    async def PurgeQueue(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow("admin", name)
        await self.find(name)
        sources = await self.settings.sources_of(name)  # what they dead-lettered to it too
        for source in sources:
            c.allow("admin", source)
        await self.backend.delete(name, contents_only=True)
        for source in sources:
            found = await self.backend.find(source)
            if found is not None:
                await self.backend.purge_dlq(found[1])
        return {}

    async def GetQueueAttributes(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow(None, name)
        queue, group = await self.find(name)
        names = strings(p, "AttributeNames")
        counts = None
        if a.needs_counts(names):
            got = await self.backend.counts(group)
            visible = got.visible
            for source in await self.settings.sources_of(name):  # what was dead-lettered to it
                found = await self.backend.find(source)
                if found is not None:
                    visible += await self.backend.dead_lettered(found[1])
            counts = (visible, got.in_flight, 0)
        attrs = a.render(queue, group, await self.settings.get(name), counts, names, c.region)
        return {"Attributes": attrs} if attrs else {}

    async def SetQueueAttributes(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow("admin", name)
        queue, group = await self.find(name)
        before = await self.settings.get(name)
        wanted = a.parse(p.get("Attributes"), creating=False, fifo=before.is_fifo)
        if wanted.fifo:
            f.check_combination({**before.fifo, **wanted.fifo})
        await self._check_target(name, wanted)
        queue.config = msgspec.structs.replace(queue.config, **wanted.queue)
        group.config = msgspec.structs.replace(group.config, **wanted.group)
        await self.backend.update(queue, group)
        await self.settings.put(name, before, wanted.apply(clone(before)))
        return {}

    async def TagQueue(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow("admin", name)
        await self.find(name)
        before = await self.settings.get(name)
        settings = clone(before)
        settings.tags = {**settings.tags, **_tags(p.get("Tags"))}
        if len(settings.tags) > 50:
            raise invalid("Too many tags added for queue: a queue holds at most 50.")
        await self.settings.put(name, before, settings)
        return {}

    async def UntagQueue(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow("admin", name)
        await self.find(name)
        keys = strings(p, "TagKeys")
        before = await self.settings.get(name)
        settings = clone(before)
        settings.tags = {k: v for k, v in settings.tags.items() if k not in keys}
        await self.settings.put(name, before, settings)
        return {}

    async def ListQueueTags(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow(None, name)
        await self.find(name)
        tags = (await self.settings.get(name)).tags
        return {"Tags": tags} if tags else {}

    async def ListDeadLetterSourceQueues(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        name = queue_name(p)
        c.allow(None, name)
        await self.find(name)
        limit = p.get("MaxResults")
        if limit is not None:
            limit = integer("MaxResults", limit, 1, 1000)
        after = _after(p.get("NextToken"))
        sources = [s for s in await self.settings.sources_of(name)
                   if (after is None or s > after) and await self.backend.find(s)]  # fmt: skip
        return _page(c, "queueUrls", sources, limit)

    async def StartMessageMoveTask(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        source = p.get("SourceArn")
        dlq = a.name_of_arn(source, "SourceArn")
        if await self.backend.find(dlq) is None:
            raise not_found(f"The resource {source} does not exist.")
        sources = [s for s in await self.settings.sources_of(dlq) if await self.backend.find(s)]
        if not sources:
            raise invalid("Source queue must be configured as a Dead Letter Queue.")
        destination = p.get("DestinationArn")
        elsewhere = None  # a queue that is not a source: the messages are copied there
        if destination:
            wanted = a.name_of_arn(destination, "DestinationArn")
            if wanted in sources:
                sources = [wanted]
            elif await self.backend.find(wanted) is None:
                raise not_found(f"The resource {destination} does not exist.")
            else:
                c.allow("produce", wanted)
                elsewhere = wanted
        rate = p.get("MaxNumberOfMessagesPerSecond")
        if rate is not None:
            rate = integer("MaxNumberOfMessagesPerSecond", rate, 1, MAX_MOVE_RATE)
        groups = []
        for name in sources:
            c.allow("admin", name)
            groups.append((await self.find(name))[1])
        handle = await self.tasks.start(dlq, groups, str(source), destination, rate, elsewhere)
        if handle is None:
            raise invalid("There is already a task running. Only one active task is allowed "
                          "for a source queue.")  # fmt: skip
        return {"TaskHandle": handle}

    async def ListMessageMoveTasks(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        source = p.get("SourceArn")
        dlq = a.name_of_arn(source, "SourceArn")
        c.allow(None, dlq)
        if await self.backend.find(dlq) is None:
            raise not_found(f"The resource {source} does not exist.")
        limit = integer("MaxResults", p.get("MaxResults", 1), 1, 10)
        tasks, props = await self.tasks.tasks(dlq)
        if any(t.status == "RUNNING" for t in tasks):
            self.tasks.watch(dlq)  # run it from here if its runner stopped
        cancel = props.get("sqs.cancel")
        return {"Results": [as_sqs(dlq, t, t.key == cancel) for t in tasks[:limit]]}

    async def CancelMessageMoveTask(self, c: Caller, p: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        handle = p.get("TaskHandle")
        if not handle:
            raise missing("TaskHandle")
        named = parse_handle(handle)
        if named is None:
            raise not_found("Task does not exist.")
        dlq, key = named
        c.allow("admin", dlq)
        task = await self.tasks.cancel(dlq, key)
        if task is not None:
            return {"ApproximateNumberOfMessagesMoved": task.moved}
        tasks, _ = await self.tasks.tasks(dlq)
        done = next((t for t in tasks if t.key == key), None)
        if done is None:
            raise not_found("Task does not exist.")
        raise invalid("Only a task with the status RUNNING can be cancelled: this one is "
                      f"{done.status}.")  # fmt: skip


def _after(token: Any) -> str | None:
    """The queue name a NextToken continues after."""
    if not token:
        return None
    try:
        return base64.urlsafe_b64decode(str(token) + "==").decode()
    except (binascii.Error, ValueError):
        raise invalid("Invalid NextToken.") from None


def _page(c: Caller, key: str, names: list[str], limit: int | None) -> dict[str, Any]:
    """Up to ``limit`` (else 1,000) of the names' URLs, and a NextToken when a limit
    was given and more are left."""
    out: dict[str, Any] = {key: [c.url(n) for n in names[: limit or 1000]]}
    if limit is not None and len(names) > limit:
        out["NextToken"] = base64.urlsafe_b64encode(names[limit - 1].encode()).decode()
    return out


def _matches(config: msgspec.Struct, wanted: dict[str, Any]) -> bool:
    return all(getattr(config, k) == v for k, v in wanted.items())


def _tags(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise invalid("Tags must be a map of key to value.")
    for key, value in raw.items():  # SQS's limits on a tag
        if not 1 <= len(key) <= 128 or len(value) > 256 or key.lower().startswith("aws:"):
            raise invalid(f"Tag {key!r} is invalid: a key is 1 to 128 characters, not "
                          "starting with aws:, and a value up to 256.")  # fmt: skip
    return dict(raw)


def strings(params: dict[str, Any], name: str) -> list[str]:
    """A parameter that is a list of strings (none given: empty)."""
    value = params.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"{name} must be a list of strings.")
    return value


def integer(name: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise invalid(
            f"Value {value!r} for parameter {name} is invalid. Reason: not an integer."
        ) from None
    if not low <= number <= high:
        raise invalid(f"Value {number} for parameter {name} is invalid. "
                      f"Reason: must be between {low} and {high}.")  # fmt: skip
    return number
