# mypy: disallow-untyped-calls=False
"""The transport: one Cherami ``Client`` per kombu connection, and ``drain_events``
handing Celery the deliveries its channels' streams put in the connection's inbox."""

from __future__ import annotations

import logging
import os
import queue as stdqueue
import sys
import threading
import time
from typing import Any

from kombu.transport import virtual

from cherami.celery.bindings import Bindings
from cherami.celery.channel import Channel, Stream
from cherami.celery.mapping import DEFAULT_PORT, endpoint
from cherami.client.models import Received
from cherami.client.sync import Client
from cherami.errors import AlreadyExists, CheramiError, NotFound, Unavailable

log = logging.getLogger("cherami.kombu")

DRAIN_BATCH = 100  # deliveries one drain_events hands over at most
WAIT_SLICE = 0.2  # seconds drain_events waits before it looks for a stopping worker


class Transport(virtual.Transport):
    Channel = Channel
    default_port = DEFAULT_PORT  # type: ignore[assignment]
    driver_type = driver_name = "cherami"
    polling_interval = None  # type: ignore[assignment]
    connection_errors = (*virtual.Transport.connection_errors, Unavailable)  # type: ignore[assignment]
    channel_errors = virtual.Transport.channel_errors
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic", "fanout"])
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.inbox: stdqueue.SimpleQueue[tuple[Stream, Received | BaseException]] = (
            stdqueue.SimpleQueue()
        )
        self._cherami: Client | None = None
        self._pid = os.getpid()
        self._declared: set[tuple[str, str | None]] = set()
        self.bindings = Bindings(self)
        self._stop = threading.Event()
        self._extender: threading.Thread | None = None

    @property
    def cherami(self) -> Client:
        """This connection's client (a forked child, such as a prefork pool's process,
        makes its own: the parent's event loop thread did not come with it)."""
        if self._cherami is None or self._pid != os.getpid():
            url, api_key, tls_ca = endpoint(self.client)
            self._cherami, self._pid = Client(url, api_key, tls_ca=tls_ca), os.getpid()
        return self._cherami

    def establish_connection(self) -> Transport:
        """Check the server answers and takes the key (a clear error if not)."""
        try:
            self.cherami.list_queues(limit=1)
        except CheramiError as err:
            url = self.cherami.url
            reason = str(err).removeprefix(f"{url}: ")
            raise type(err)(f"cherami broker {url}: {reason}") from None
        return super().establish_connection()  # type: ignore[no-any-return]

    def close_connection(self, connection: Any) -> None:
        self._stop.set()
        super().close_connection(connection)
        if self._cherami is not None and self._pid == os.getpid():
            self._cherami.close()
        self._cherami = None

    def ensure(
        self,
        name: str,
        group: str | None,
        queue_config: dict[str, Any],
        group_config: dict[str, Any],
    ) -> None:
        """Create the queue (and the group) unless this connection saw them already."""
        if (name, group) in self._declared:
            return
        _create(
            lambda: self.cherami.get_queue(name),
            lambda: self.cherami.create_queue(name, **queue_config),
        )
        if group is not None:
            _create(lambda: self.cherami.get_group(name, group),
                    lambda: self.cherami.create_group(name, group, **group_config))  # fmt: skip
        self._declared.add((name, group))

    def forget(self, name: str, group: str | None = None) -> None:
        """A queue (or only a group of it) deleted: ``ensure`` creates it again."""
        self._declared = {d for d in self._declared if d[0] != name or group not in (None, d[1])}

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:  # type: ignore[override]
        """Deliver the messages that are here, up to DRAIN_BATCH, waiting up to
        ``timeout`` seconds for the first (TimeoutError when none came)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for channel in self.channels:
            if channel._consumers:
                channel.open_streams()
        self._start_extender()
        delivered = 0
        while delivered < DRAIN_BATCH:
            try:
                if delivered:
                    stream, item = self.inbox.get_nowait()
                else:
                    stream, item = self._wait(deadline)
            except stdqueue.Empty:
                if delivered:
                    return
                raise TimeoutError() from None
            delivered += self._take(stream, item)

    def _wait(self, deadline: float | None) -> tuple[Stream, Received | BaseException]:
        """The next item of the inbox, waiting until ``deadline``; a Celery worker told to
        stop (SIGTERM, SIGINT) is let go at once rather than at the end of its wait (its
        loop waits 2 s at a time here, and checks for a stop only between waits)."""
        while True:
            left = WAIT_SLICE if deadline is None else deadline - time.monotonic()
            try:
                return self.inbox.get(timeout=max(0.0, min(left, WAIT_SLICE)))
            except stdqueue.Empty:
                if left <= WAIT_SLICE or _worker_stopping():
                    raise

    def _take(self, stream: Stream, item: Received | BaseException) -> int:
        """Hand one delivery to its consumer's callback: 1 if it was, else 0."""
        if stream.closed:
            return 0  # its stream ended: the server delivers its messages again
        if isinstance(item, BaseException):
            raise Unavailable(f"the stream of queue {stream.queue} ended: {item}") from item
        if stream.queue not in self._callbacks:  # cancelled meanwhile
            stream.consumer.nack(item)
            return 0
        payload = stream.channel.delivered(stream, item)
        if payload is None:
            return 0
        self._deliver(payload, stream.queue)
        return 1

    def _start_extender(self) -> None:
        if self._extender is None:
            self._extender = threading.Thread(
                target=self._extend, name="cherami-kombu extend", daemon=True
            )
            self._extender.start()

    def _extend(self) -> None:
        """Keep every held delivery invisible until it is settled: extended each third
        of its group's visibility timeout."""
        while not self._stop.wait(1.0):
            now = time.monotonic()
            for channel in list(self.channels):
                for stream, messages in channel.held_by_stream().items():
                    if now < stream.extended_at + stream.visibility / 3:
                        continue
                    stream.extended_at = now
                    try:
                        stream.consumer.extend(
                            *messages, visibility_timeout_seconds=stream.visibility
                        )
                    except Exception as err:
                        log.warning(
                            "extending %d deliveries of %s: %s", len(messages), stream.queue, err
                        )


def _create(get: Any, create: Any) -> None:
    try:
        get()
    except NotFound:
        try:
            create()
        except AlreadyExists:  # made meanwhile by another process (with another config)
            pass


def _worker_stopping() -> bool:
    """Whether this process is a Celery worker that was told to stop."""
    state = sys.modules.get("celery.worker.state")
    return state is not None and (
        state.should_stop is not None or state.should_terminate is not None
    )
