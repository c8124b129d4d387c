# mypy: disallow-untyped-calls=False
"""The channel: a kombu virtual channel whose queues are Cherami queues, published to by
streaming publishers and consumed through streaming consumers (``Stream``)."""

from __future__ import annotations

import logging
import os
import queue as stdqueue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.utils.json import dumps

from cherami.celery.bindings import Bindings
from cherami.celery.mapping import (
    DEFAULT_CREDIT,
    DEFAULT_GROUP,
    ENVELOPE,
    MAX_DELAY,
    cherami_name,
    eta_delay,
    fanout_queue,
    payload_of,
)
from cherami.client.models import OutgoingMessage, Received
from cherami.client.sync import Client, SyncConsumer, SyncPublisher
from cherami.errors import CheramiError, NotFound

if TYPE_CHECKING:
    from cherami.celery.transport import Transport

log = logging.getLogger("cherami.kombu")

TRANSIENT = 1  # kombu's delivery_mode of a message that need not outlive a restart
EARLY = 0.1  # seconds ahead of its eta a delivery is still handed over (else it waits again)


class Stream:
    """One queue a channel consumes: a streaming consumer and the thread that moves its
    deliveries into the transport's inbox (a thread-safe queue ``drain_events`` reads)."""

    def __init__(self, channel: Channel, queue: str, consumer: SyncConsumer, visibility: float):
        self.channel = channel
        self.queue = queue
        self.consumer = consumer
        self.visibility = visibility
        self.paused = False  # basic_cancel: take no more; settle what is held
        self.closed = False
        self.extended_at = time.monotonic()
        self._thread = threading.Thread(
            target=self._pump, name=f"cherami-kombu {queue}", daemon=True
        )
        self._thread.start()

    def _pump(self) -> None:
        inbox = self.channel.connection.inbox
        try:
            while not self.closed and not self.paused:
                for message in self.consumer.get_batch(1000, timeout=1.0):
                    inbox.put((self, message))
        except Exception as err:  # the stream is gone for good: drain_events raises it
            if not self.closed:
                inbox.put((self, err))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.consumer.close()
            except Exception as err:  # the client may be closed already
                log.debug("closing the stream of %s: %s", self.queue, err)


class QoS(virtual.QoS):
    """kombu's prefetch accounting; a reject is a nack the channel sent already, and a
    restore nacks what is held (the server delivers it again) instead of publishing it."""

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        self.channel.settle(tags, nack=True)
        return []


class Channel(virtual.Channel):
    QoS = QoS
    supports_fanout = True
    body_encoding = "utf-8"  # bodies travel as they are (a Cherami body is bytes)

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        options = self.connection.client.transport_options
        self.group = str(options.get("consumer_group", DEFAULT_GROUP))
        self.queue_config: dict[str, Any] = dict(options.get("queue_config", {}))
        self.group_config: dict[str, Any] = dict(options.get("group_config", {}))
        self.requeue_delay = float(options.get("requeue_delay_seconds", 0))
        self.confirm = bool(options.get("confirm_publish", True))
        self._streams: dict[str, Stream] = {}
        self._no_ack: set[str] = set()
        # delivery tag -> the stream that delivered it, or the queue an HTTP get read it from
        self._held: dict[str, tuple[Stream | str, Received]] = {}
        self._held_lock = threading.Lock()
        self._publishers: dict[str, SyncPublisher] = {}
        self._publishing = threading.Lock()
        # the bindings of the connection, not the channel's: kombu declares on one channel
        # and may consume on another
        self.bindings: Bindings = self.connection.bindings
        self._pid = os.getpid()
        self._auto_delete: set[str] = set()

    @property
    def client(self) -> Client:
        return self.connection.cherami  # type: ignore[no-any-return]

    # queues and bindings
    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        if kwargs.get("auto_delete"):  # deleted when this channel closes, as in AMQP
            self._auto_delete.add(queue)
        self.connection.ensure(
            cherami_name(queue), self.group, self.queue_config, self.group_config
        )

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        try:
            self.client.get_queue(cherami_name(queue))
        except NotFound:
            return False
        return True

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        """Delete the queue, its bindings and its Cherami queue (kombu's deletes only the
        bindings this process declared, one ``_delete`` each, so a queue this process
        never bound was left)."""
        if if_empty and self._size(queue):
            return
        super().queue_delete(queue, if_unused, if_empty, **kwargs)
        name = cherami_name(queue)
        stream = self._streams.pop(queue, None)
        if stream is not None:
            stream.close()
        publisher = self._publishers.pop(name, None)
        if publisher is not None:
            publisher.close()
        _ignore_missing(lambda: self.client.delete_queue(name))
        self.connection.forget(name)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        """One of a deleted queue's bindings: taken back where every process sees it."""
        if args and args[0]:
            exchange, routing_key = args[0], args[1] if len(args) > 1 else ""
            self.bindings.unbind(self.typeof(exchange).type, exchange, routing_key, queue)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: Any, queue: str) -> None:
        kind = self.typeof(exchange).type
        self.bindings.bind(kind, exchange, routing_key, queue, self.queue_config, self.group_config)

    def _lookup(self, exchange: str, routing_key: str, default: Any = None) -> list[str]:
        """The queues a message goes to: by the bindings this process declared and, for a
        topic exchange, those of every process; for a direct exchange, those of every
        process when this one has none for the key."""
        found: list[str] = list(super()._lookup(exchange, routing_key, default))
        kind = self.typeof(exchange).type if exchange else ""
        if kind == "topic":
            return sorted(
                {cherami_name(q) for q in found} | set(self.bindings.topic(exchange, routing_key))
            )
        if kind == "direct" and not found:
            return self.bindings.direct(exchange, routing_key)
        return found

    # publishing
    def basic_publish(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> Any:
        """As kombu's, but to an exchange this process did not declare that another
        process made a fanout one (a Celery ``Broadcast`` queue's exchange, which a
        producer does not declare): every queue bound to it gets the message."""
        if exchange and exchange not in self.state.exchanges and self.bindings.is_fanout(exchange):
            self._inplace_augment_message(message, exchange, routing_key)
            return self._put_fanout(exchange, message, routing_key, **kwargs)
        return super().basic_publish(message, exchange, routing_key, **kwargs)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        name = cherami_name(queue)
        self.connection.ensure(name, self.group, self.queue_config, self.group_config)
        self._publish(name, message)

    def _put_fanout(
        self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any
    ) -> None:
        name = fanout_queue(exchange)
        self.connection.ensure(name, None, self.queue_config, {})
        self._publish(name, message)

    def _publish(self, name: str, message: dict[str, Any], delay: float | None = None) -> None:
        body = message.get("body") or b""
        envelope = {k: v for k, v in message.items() if k != "body"}
        envelope["body_is_text"] = isinstance(body, str)
        if delay is None:
            delay = eta_delay(message.get("headers"))
        outgoing = OutgoingMessage(
            body.encode() if isinstance(body, str) else bytes(body),
            {ENVELOPE: dumps(envelope)},
            min(delay, MAX_DELAY) if delay > 0 else None,
        )
        publisher = self._publisher(name)
        transient = (message.get("properties") or {}).get("delivery_mode") == TRANSIENT
        if self.confirm and not transient:  # events and remote control are transient
            publisher.publish([outgoing])
        else:
            publisher.send([outgoing]).add_done_callback(_report_failure)

    def _publisher(self, name: str) -> SyncPublisher:
        with self._publishing:
            publisher = self._publishers.get(name)
            if publisher is None:
                publisher = self._publishers[name] = self.client.publisher(name).__enter__()
            return publisher

    # consuming
    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack.add(queue)
        stream = self._streams.get(queue)
        if stream is not None and stream.paused:  # consumed again after a cancel
            stream.close()
            del self._streams[queue]
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        stream = self._streams.get(queue) if queue is not None else None
        if stream is not None:
            stream.paused = True  # what it holds can still be acked until the channel closes
        return super().basic_cancel(consumer_tag)

    def open_streams(self) -> None:
        """A stream for each consumed queue without one (the prefetch count is known by
        the first drain, so a stream's credit is that count)."""
        for queue in list(self._active_queues):
            if queue not in self._streams:
                self._streams[queue] = self._open_stream(queue)

    def _open_stream(self, queue: str) -> Stream:
        source, group = self.bindings.source(queue, self.group)
        visibility = float(self.client.get_group(source, group)["visibility_timeout_seconds"])
        credit = int(self.qos.prefetch_count or DEFAULT_CREDIT)
        consumer = self.client.consumer(source, group, credit).__enter__()
        return Stream(self, queue, consumer, visibility)

    def delivered(self, stream: Stream, message: Received) -> dict[str, Any] | None:
        """The kombu payload of a delivery, now held under a new delivery tag; None when
        it was handled here (an eta still ahead: published again for its time)."""
        payload = payload_of(message)
        delay = eta_delay(payload.get("headers"))
        # later than Cherami delays reach: wait again, durably (a fanout queue's copy is
        # handed over: published again, it would reach every queue bound to the exchange)
        if delay > EARLY and stream.queue not in self.bindings.fanout_of:
            self._publish(cherami_name(stream.queue), payload, delay)
            stream.consumer.ack(message)
            return None
        tag = f"{message.id}/{message.handle}"
        properties = payload["properties"]
        properties["delivery_tag"] = tag
        properties.setdefault("delivery_info", {})["redelivered"] = message.delivery_count > 1
        payload["redelivered"] = message.delivery_count > 1
        if stream.queue in self._no_ack:
            stream.consumer.ack(message)
        else:
            with self._held_lock:
                self._held[tag] = (stream, message)
        return payload

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        """One message by HTTP (``basic_get``), held until acked like a streamed one."""
        got = self.client.receive(cherami_name(queue), self.group, 1)
        if not got:
            raise stdqueue.Empty()
        message = got[0]
        payload = payload_of(message)
        tag = payload["properties"]["delivery_tag"] = f"{message.id}/{message.receipt}"
        with self._held_lock:
            self._held[tag] = (cherami_name(queue), message)
        return payload

    # settling
    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        self.settle([delivery_tag], nack=False)
        super().basic_ack(delivery_tag)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.settle([delivery_tag], nack=True)
        super().basic_reject(delivery_tag, requeue)

    def settle(self, tags: list[str], nack: bool) -> None:
        """Ack or nack held deliveries (a tag no longer held is skipped)."""
        if self.forked:
            return
        with self._held_lock:
            held = [h for h in (self._held.pop(t, None) for t in tags) if h is not None]
        for stream, message in held:
            try:
                if isinstance(stream, str):  # an HTTP get's
                    queue = stream
                    if nack:
                        self.client.nack(queue, self.group, message, self.requeue_delay)
                    else:
                        self.client.ack(queue, self.group, message)
                elif nack:
                    stream.consumer.nack(message, delay_seconds=self.requeue_delay)
                else:
                    stream.consumer.ack(message)
            except CheramiError as err:  # the server delivers it again
                log.warning("could not settle message %s: %s", message.id, err)

    def held_by_stream(self) -> dict[Stream, list[Received]]:
        with self._held_lock:
            held = list(self._held.values())
        by_stream: dict[Stream, list[Received]] = {}
        for stream, message in held:
            if isinstance(stream, Stream) and not stream.closed:
                by_stream.setdefault(stream, []).append(message)
        return by_stream

    # purge, size
    def _size(self, queue: str) -> int:
        try:
            stats = self.client.get_group(cherami_name(queue), self.group)["stats"]
        except NotFound:
            return 0
        return max(0, int(stats["backlog"]) - int(stats["in_flight"]))

    def _purge(self, queue: str) -> int:
        name = cherami_name(queue)
        try:
            count = int(self.client.get_group(name, self.group)["stats"]["backlog"])
            self.client.delete_queue(name, contents_only=True)
        except NotFound:
            return 0
        return count

    def _drop_auto_deleted(self, client: Client, queue: str, bound: list[Any]) -> None:
        """An auto-delete queue (a worker's remote-control queue, a reply queue) and the
        bindings other processes see of it."""
        name = cherami_name(queue)
        try:
            for exchange, routing_key, kind in bound:
                self.bindings.unbind(kind, exchange, routing_key, queue)
            _ignore_missing(lambda: client.delete_queue(name))
        except CheramiError as err:
            log.warning("could not delete the auto-delete queue %s: %s", name, err)

    def _bound(self, queue: str) -> list[tuple[str, str, str]]:
        """A queue's bindings: (exchange, routing key, exchange type) each."""
        return [(b.exchange, b.routing_key, self.typeof(b.exchange).type)
                for b in self.state.queue_bindings(queue)]  # fmt: skip

    @property
    def forked(self) -> bool:
        """A copy of the channel in a forked child (a prefork pool's process, whose
        after-fork hooks close the connections it inherited): the streams, the deliveries
        and the event loop are the parent's, so it leaves them alone."""
        return self._pid != os.getpid()

    def close(self) -> None:
        if self.closed:
            return
        if self.forked:
            self.closed = True
            self._streams.clear()
            self._publishers.clear()
            return
        client = self.client if self._auto_delete else None  # kombu's close takes it away
        bound = {q: self._bound(q) for q in self._auto_delete}
        super().close()  # restores (nacks) what is held
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        if client is not None:
            for queue in self._auto_delete:
                self._drop_auto_deleted(client, queue, bound[queue])
        for publisher in self._publishers.values():
            try:
                publisher.close()
            except CheramiError as err:
                log.warning("closing a publisher: %s", err)
        self._publishers.clear()


def _ignore_missing(call: Any) -> None:
    try:
        call()
    except NotFound:
        pass


def _report_failure(sent: Future[list[str]]) -> None:
    """A publish sent without waiting (``confirm_publish: False``) that failed: logged,
    as nobody waits for it."""
    if not sent.cancelled() and sent.exception() is not None:
        log.error("a message published without confirm was not stored: %s", sent.exception())
