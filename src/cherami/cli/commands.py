"""Client commands of the CLI: ``queue``, ``group``, ``publish``, ``consume`` and ``dlq``.

Every command takes ``--url`` (``CHERAMI_URL``) and ``--api-key`` (``CHERAMI_API_KEY``).
``show``/``list`` print pretty JSON; errors print one line on stderr and exit 1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import IO, Any, TypeVar

import click
from click.core import ParameterSource

from cherami.cli.main import cli
from cherami.cli.output import Listing, emit
from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage, Received
from cherami.errors import CheramiError, Unavailable

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_URL = "http://127.0.0.1:8080"
STDIN_BATCH = 500
MAX_WAIT_PER_RECEIVE = 20.0


# shared plumbing
def connection_options(command: F) -> F:
    """``--url`` and ``--api-key``, handed to the command as one ``client`` factory."""

    @click.option("--url", envvar="CHERAMI_URL", default=DEFAULT_URL, show_default=True,
                  callback=_check_url, help="Server URL (env CHERAMI_URL).")  # fmt: skip
    @click.option("--api-key", envvar="CHERAMI_API_KEY", default=None,
                  help="API key (env CHERAMI_API_KEY).")  # fmt: skip
    @click.option("--tls-ca", envvar="CHERAMI_TLS_CA", default=None,
                  help="PEM CA that verifies an https:// server (env CHERAMI_TLS_CA).")  # fmt: skip
    @functools.wraps(command)
    def wrapper(url: str, api_key: str | None, tls_ca: str | None, **kwargs: Any) -> Any:
        url = _check_url(None, None, _before_the_command("url", url))  # type: ignore[arg-type]
        api_key = _before_the_command("api_key", api_key)
        tls_ca = _before_the_command("tls_ca", tls_ca)
        return command(lambda: AsyncClient(url, api_key, tls_ca=tls_ca), **kwargs)

    return wrapper  # type: ignore[return-value]


def _before_the_command(name: str, value: Any) -> Any:
    """The option as given before the command (``cherami --url U queue list``) unless
    the command was given it itself; a flag beats the environment either way."""
    ctx = click.get_current_context()
    given = ctx.find_root().params.get(name)
    if given is not None and ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
        return given
    return value


def _check_url(ctx: click.Context, param: click.Parameter, url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r} must start with http:// or https://")
    return url


ClientFactory = Callable[[], AsyncClient]


def run(factory: ClientFactory, call: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Run one client call on a fresh event loop; a timeout becomes a one-line error."""

    async def main() -> T:
        async with factory() as client:
            try:
                return await call(client)
            except TimeoutError:
                raise Unavailable(f"{client.url}: request timed out") from None

    return asyncio.run(main())


def echo_json(value: Any) -> None:
    emit(value)  # JSON, or tables with --output table (output.py)


def echo_listing(
    factory: ClientFactory,
    items: Callable[[AsyncClient], AsyncIterator[dict[str, Any]]],
    page_size: int,
) -> None:
    """Print a listing page by page as the server answers it (output.Listing)."""

    async def show(client: AsyncClient) -> None:
        printer = Listing(page_size)
        async for item in items(client):
            printer.add(item)
        printer.end()

    run(factory, show)


def listing_options(kind: str) -> Callable[[F], F]:
    """``--prefix``, ``--limit`` and ``--page-size`` of a ``list`` command."""

    def add(command: F) -> F:
        for option in reversed([
            click.option("--prefix", help=f"Only {kind} whose names start with this."),
            click.option("--limit", type=click.IntRange(min=1),
                         help=f"List this many {kind} at the most (default: every one)."),
            click.option("--page-size", type=click.IntRange(1, 1000), default=1000,
                         show_default=True,
                         help=f"{kind.capitalize()} asked of the server at once; each page "
                              "is printed as it arrives."),
        ]):  # fmt: skip
            command = option(command)
        return command

    return add


def message_json(message: Received) -> dict[str, Any]:
    try:
        body: dict[str, str] = {"body": message.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"body_b64": base64.b64encode(message.body).decode()}
    return {
        "id": message.id,
        **body,
        "delivery_count": message.delivery_count,
        "attributes": message.attributes,
        **({"receipt": message.receipt} if message.receipt else {}),
    }


def parse_attributes(pairs: tuple[str, ...]) -> dict[str, str]:
    """``k=v`` pairs into a dict (the value may contain ``=``)."""
    attributes: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not of the form key=value", param_hint="--attr")
        attributes[key] = value
    return attributes


def drop_unset(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


# queues
@cli.group()
def queue() -> None:
    """Create, list, show, update and delete queues."""


@queue.command("create")
@click.argument("name")
@click.option("--type", "type_", type=click.Choice(["ap", "cp"]), help="Consistency (default ap).")
@click.option("--replicas", type=int, help="Copies of each message (default min(3, store hosts)).")
@click.option("--min-extents", type=int, help="Open extents kept at the least (parallel writers).")
@click.option("--max-extents", type=int, help="Open extents the queue may scale up to.")
@click.option("--extent-target-rate", type=float, help="msgs/s one extent should carry.")
@click.option("--delay-seconds", type=float, help="Every message waits this long first.")
@click.option("--retention-seconds", type=float, help="How long unconsumed messages are kept.")
@click.option("--max-message-bytes", type=int, help="Largest message body accepted.")
@connection_options
def queue_create(client: ClientFactory, name: str, type_: str | None, **options: Any) -> None:
    """Create queue NAME (no change if it exists with the same config)."""
    config = drop_unset(type=type_, **options)
    echo_json(run(client, lambda c: c.create_queue(name, **config)))


@queue.command("update")
@click.argument("name")
@click.option("--min-extents", type=int, help="Open extents kept at the least.")
@click.option("--max-extents", type=int, help="Open extents the queue may scale up to.")
@click.option("--extent-target-rate", type=float, help="msgs/s one extent should carry.")
@click.option("--delay-seconds", type=float, help="Every message waits this long first.")
@click.option("--retention-seconds", type=float, help="How long unconsumed messages are kept.")
@click.option("--consumed-retention-seconds", type=float,
              help="How long messages every group has acked are kept.")  # fmt: skip
@click.option("--max-message-bytes", type=int, help="Largest message body accepted.")
@click.option("--publish-rate", type=float, help="Messages/s accepted (0: no limit).")
@click.option("--publish-burst", type=float, help="Messages accepted at once above the rate.")
@click.option("--max-backlog-bytes", type=int,
              help="Refuse publishes over this many unconsumed bytes (0: no limit).")  # fmt: skip
@connection_options
def queue_update(client: ClientFactory, name: str, **options: Any) -> None:
    """Change settings of queue NAME (the ones given; the rest stay)."""
    patch = drop_unset(**options)
    if not patch:
        raise click.UsageError("give at least one setting to change")
    echo_json(run(client, lambda c: c.update_queue(name, **patch)))


@queue.command("list")
@listing_options("queues")
@connection_options
def queue_list(client: ClientFactory, prefix: str | None, limit: int | None,
               page_size: int) -> None:  # fmt: skip
    """List the queues by name, a page at a time (the groups' DLQs are not listed)."""
    echo_listing(client, lambda c: c.iter_queues(prefix, limit=limit, page_size=page_size),
                 page_size)  # fmt: skip


@queue.command("show")
@click.argument("name")
@connection_options
def queue_show(client: ClientFactory, name: str) -> None:
    """Show queue NAME with its stats."""
    echo_json(run(client, lambda c: c.get_queue(name)))


@queue.command("delete")
@click.argument("name")
@click.option("--contents-only", is_flag=True, help="Delete the messages, keep queue and groups.")
@connection_options
def queue_delete(client: ClientFactory, name: str, contents_only: bool) -> None:
    """Delete queue NAME."""
    run(client, lambda c: c.delete_queue(name, contents_only=contents_only))


# consumer groups
@cli.group()
def group() -> None:
    """Create, list, show, update and delete consumer groups."""


def group_settings(with_defaults: bool = False) -> Callable[[F], F]:
    """The options of a group's changeable settings (create, with their defaults; update)."""
    visibility, deliveries = (" (default 60)", " (default 10)") if with_defaults else ("", "")

    def add(command: F) -> F:
        for option in reversed([
            click.option("--visibility-timeout", "visibility_timeout_seconds", type=float,
                          help=f"Seconds a delivery stays invisible{visibility}."),
            click.option("--max-delivery-count", type=int,
                         help=f"Deliveries before the DLQ{deliveries}."),
            click.option("--delay-seconds", type=float,
                         help="Deliveries to this group wait this long."),
        ]):  # fmt: skip
            command = option(command)
        return command

    return add


@group.command("create")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("name", metavar="GROUP")
@group_settings(with_defaults=True)
@click.option("--start-from", help="earliest (default), latest, or an RFC 3339 time.")
@click.option("--type", "type_", type=click.Choice(["competing", "stream"]),
              help="competing (default: receive/ack) or stream (offsets, e.g. Spark).")  # fmt: skip
@connection_options
def group_create(client: ClientFactory, queue_name: str, name: str, type_: str | None,
                 **options: Any) -> None:  # fmt: skip
    """Create consumer group GROUP on QUEUE."""
    config = drop_unset(type=type_, **options)
    echo_json(run(client, lambda c: c.create_group(queue_name, name, **config)))


@group.command("update")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("name", metavar="GROUP")
@group_settings()
@connection_options
def group_update(client: ClientFactory, queue_name: str, name: str, **options: Any) -> None:
    """Change settings of consumer group GROUP of QUEUE (the ones given; the rest stay)."""
    patch = drop_unset(**options)
    if not patch:
        raise click.UsageError("give at least one setting to change")
    echo_json(run(client, lambda c: c.update_group(queue_name, name, **patch)))


@group.command("list")
@click.argument("queue_name", metavar="QUEUE")
@listing_options("groups")
@connection_options
def group_list(client: ClientFactory, queue_name: str, prefix: str | None, limit: int | None,
               page_size: int) -> None:  # fmt: skip
    """List the consumer groups of QUEUE by name, a page at a time."""
    echo_listing(
        client, lambda c: c.iter_groups(queue_name, prefix, limit=limit, page_size=page_size),
        page_size,
    )  # fmt: skip


@group.command("show")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("name", metavar="GROUP")
@connection_options
def group_show(client: ClientFactory, queue_name: str, name: str) -> None:
    """Show consumer group GROUP of QUEUE with its stats."""
    echo_json(run(client, lambda c: c.get_group(queue_name, name)))


@group.command("delete")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("name", metavar="GROUP")
@connection_options
def group_delete(client: ClientFactory, queue_name: str, name: str) -> None:
    """Delete consumer group GROUP of QUEUE."""
    run(client, lambda c: c.delete_group(queue_name, name))


# publish
@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("bodies", metavar="[BODY]...", nargs=-1)
@click.option("--attr", "attrs", multiple=True, metavar="KEY=VALUE",
              help="An attribute of every message (repeatable).")  # fmt: skip
@click.option("--delay-seconds", type=float, default=None, help="Deliver no earlier than this.")
@click.option("--batch-size", type=click.IntRange(1, 1000), default=STDIN_BATCH,
              show_default=True, help="Messages per batch when reading stdin.")  # fmt: skip
@connection_options
def publish(
    client: ClientFactory,
    queue_name: str,
    bodies: tuple[str, ...],
    attrs: tuple[str, ...],
    delay_seconds: float | None,
    batch_size: int,
) -> None:
    """Publish each BODY to QUEUE and print the message ids; without BODY, publish each
    line of stdin (streamed in batches) and print how many were published."""
    attributes = parse_attributes(attrs) or None
    if bodies:
        messages = [OutgoingMessage(body, attributes, delay_seconds) for body in bodies]
        for message_id in run(client, lambda c: c.publish(queue_name, messages)):
            click.echo(message_id)
        return
    if sys.stdin.isatty():
        batch_size = 1  # a line typed is sent when Enter is pressed
    # a reader of its own: after Ctrl-C a thread stays blocked in it, and the interpreter
    # would abort at exit closing sys.stdin while the thread holds its lock
    stdin = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
    batches = (
        [OutgoingMessage(body, attributes, delay_seconds) for body in batch]
        for batch in read_batches(stdin, batch_size)
    )
    try:
        count = run(client, lambda c: publish_stream(c, queue_name, batches))
    except Interrupted as stop:
        click.echo(f"interrupted: {stop}", err=True)
        sys.exit(130)
    except KeyboardInterrupt:  # before the stream was open
        click.echo("interrupted: published 0 messages", err=True)
        sys.exit(130)
    click.echo(f"published {count} messages")


def read_batches(stream: IO[bytes], size: int) -> Iterator[list[str | bytes]]:
    """Non-empty lines of ``stream`` (text when UTF-8, else bytes), ``size`` at a time."""
    batch: list[str | bytes] = []
    for raw in stream:
        line = raw.rstrip(b"\r\n")
        if not line:
            continue
        try:
            batch.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            batch.append(line)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class Interrupted(Exception):
    """Ctrl-C stopped ``cherami publish`` reading stdin; says what got in."""

    def __init__(self, published: int, unconfirmed: int) -> None:
        lost = f"; {unconfirmed} sent were not confirmed" if unconfirmed else ""
        super().__init__(f"published {published} messages{lost}")


async def publish_stream(
    client: AsyncClient, queue_name: str, batches: Iterator[list[OutgoingMessage]]
) -> int:
    """Pipeline the batches through a streaming publisher, with a progress bar on a
    terminal; returns how many messages are durable.

    Ctrl-C stops reading (raises ``Interrupted`` once what was sent is durable; a second
    Ctrl-C stops waiting for it). The batches are read in a daemon thread: a read of a
    terminal blocks until a line comes and must not keep the process from exiting."""
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TimeElapsedColumn

    await client.get_queue(queue_name)  # the stream's handshake would lose the server's error
    console = Console(stderr=True)
    columns = (SpinnerColumn(), *Progress.get_default_columns()[:1], MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    published = sent = 0
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:  # fmt: skip
        task = progress.add_task(f"publishing to {queue_name}", total=None)

        def done(future: asyncio.Future[list[str]]) -> None:
            nonlocal published
            if not future.cancelled() and future.exception() is None:
                published += len(future.result())
                progress.update(task, completed=published)

        async with client.publisher(queue_name) as publisher:
            with _ctrl_c() as ctrl_c:
                while not ctrl_c.pressed:
                    reading = _in_daemon_thread(lambda: next(batches, None))
                    if not await ctrl_c.or_stop(reading) or (batch := reading.result()) is None:
                        break
                    sending = asyncio.ensure_future(publisher.send(batch))  # waits for a slot
                    if not await ctrl_c.or_stop(sending, 2):
                        break
                    sent += len(batch)
                    sending.result().add_done_callback(done)
                flushing = asyncio.ensure_future(publisher.flush())
                try:
                    if flushed := await ctrl_c.or_stop(flushing, 2):
                        flushing.result()
                except CheramiError as err:  # say what did get in, then fail
                    err.message = f"{err.message} (published {published} messages; not that batch)"
                    raise
                if ctrl_c.pressed:
                    raise Interrupted(published, 0 if flushed else sent - published)
    return published


class _CtrlC:
    """Counts SIGINTs; ``or_stop`` waits for a future unless Ctrl-C is pressed enough."""

    def __init__(self) -> None:
        self.pressed = 0
        self._press = asyncio.Event()

    def press(self) -> None:
        self.pressed += 1
        self._press.set()

    async def or_stop(self, future: asyncio.Future[Any], presses: int = 1) -> bool:
        """Whether ``future`` is done; False (it is cancelled) once ``presses`` in all."""
        while not future.done() and self.pressed < presses:
            self._press.clear()
            waiter = asyncio.ensure_future(self._press.wait())
            try:
                await asyncio.wait({future, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if future.done():
            return True
        future.cancel()
        return False


@contextlib.contextmanager
def _ctrl_c() -> Iterator[_CtrlC]:
    """SIGINT counted by a ``_CtrlC`` instead of interrupting (in the main thread)."""
    ctrl_c = _CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    loop.add_signal_handler(signal.SIGINT, ctrl_c.press)
    try:
        yield ctrl_c
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)  # asyncio.run's, which cancels the run


def _in_daemon_thread(call: Callable[[], T]) -> asyncio.Future[T]:
    """``call()`` in a daemon thread, as a future of this loop. A read of a terminal
    left blocked there (Ctrl-C) does not hold the process up, as an executor's would."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled: nobody waits for it
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def main() -> None:
        result, error = None, None
        try:
            result = call()
        except Exception as err:
            error = err
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=main, name="cherami-stdin", daemon=True).start()
    return future


# consume
@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@click.option("--max", "max_messages", type=click.IntRange(min=1), default=10, show_default=True,
              help="Stop after this many messages.")  # fmt: skip
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=0), default=1.0,
              show_default=True, help="Stop after this long without a message.")  # fmt: skip
@click.option("--ack", is_flag=True, help="Ack what was printed (else it is redelivered later).")
@connection_options
def consume(client: ClientFactory, queue_name: str, group_name: str, max_messages: int,
            wait_seconds: float, ack: bool) -> None:  # fmt: skip
    """Receive up to --max messages from GROUP of QUEUE; print each as one JSON line
    (id, body or body_b64, delivery_count, attributes, receipt: for cherami ack/nack)."""

    async def receive_all(c: AsyncClient) -> None:
        remaining = max_messages
        while remaining > 0:
            messages = await receive_within(c, queue_name, group_name, remaining, wait_seconds)
            if not messages:
                return
            for message in messages:
                click.echo(json.dumps(message_json(message), ensure_ascii=False))
            if ack:
                await c.ack(queue_name, group_name, [m.receipt for m in messages if m.receipt])
            remaining -= len(messages)

    run(client, receive_all)


# A receipt is URL-safe base64, so one in 64 starts with "-": such arguments are
# receipts, not unknown options (ack and nack have no short options to confuse them with).
RECEIPT_ARGUMENTS = {"ignore_unknown_options": True}


def receipts_given(receipts: tuple[str, ...]) -> list[str]:
    """The receipts given as arguments, else one a line on stdin."""
    given = list(receipts) or [line.strip() for line in sys.stdin if line.strip()]
    if not given:
        raise click.UsageError("give receipts as arguments or one a line on stdin")
    return given


@cli.command("ack", context_settings=RECEIPT_ARGUMENTS)
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@click.argument("receipts", nargs=-1, type=click.UNPROCESSED)
@connection_options
def ack_command(client: ClientFactory, queue_name: str, group_name: str,
                receipts: tuple[str, ...]) -> None:  # fmt: skip
    """Ack deliveries of GROUP by their RECEIPTS (from cherami consume; arguments, or one
    a line on stdin). Prints how many were acked and the stale receipts."""
    given = receipts_given(receipts)
    echo_json(run(client, lambda c: c.ack(queue_name, group_name, given)))


@cli.command("nack", context_settings=RECEIPT_ARGUMENTS)
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@click.argument("receipts", nargs=-1, type=click.UNPROCESSED)
@click.option("--delay-seconds", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Deliver them again after this long.")  # fmt: skip
@connection_options
def nack_command(client: ClientFactory, queue_name: str, group_name: str,
                 receipts: tuple[str, ...], delay_seconds: float) -> None:  # fmt: skip
    """Give deliveries of GROUP back by their RECEIPTS (arguments, or one a line on
    stdin), to be delivered again after --delay-seconds."""
    given = receipts_given(receipts)
    echo_json(run(client, lambda c: c.nack(queue_name, group_name, given, delay_seconds)))


async def receive_within(
    client: AsyncClient, queue_name: str, group_name: str, limit: int, wait_seconds: float
) -> list[Received]:
    """Long-poll (in steps the API allows) until a message comes or ``wait_seconds`` pass."""
    deadline = time.monotonic() + wait_seconds
    while True:
        wait = min(MAX_WAIT_PER_RECEIVE, max(0.0, deadline - time.monotonic()))
        messages = await client.receive(queue_name, group_name, min(limit, 1000), wait)
        if messages or time.monotonic() >= deadline:
            return messages


# dead-letter queue
@cli.group()
def dlq() -> None:
    """Browse, merge back or purge the dead-letter queue of a consumer group."""


@dlq.command("show")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="Messages to show at most.")  # fmt: skip
@connection_options
def dlq_show(client: ClientFactory, queue_name: str, group_name: str, limit: int) -> None:
    """Show the DLQ's depth and its first --limit messages (without consuming them)."""
    echo_json(run(client, lambda c: c.dlq(queue_name, group_name, limit)))


@dlq.command("merge")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@connection_options
def dlq_merge(client: ClientFactory, queue_name: str, group_name: str) -> None:
    """Deliver the DLQ's messages again to GROUP."""
    echo_json({"merged": run(client, lambda c: c.dlq_merge(queue_name, group_name))})


@dlq.command("purge")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@connection_options
def dlq_purge(client: ClientFactory, queue_name: str, group_name: str) -> None:
    """Drop the DLQ's messages."""
    echo_json({"purged": run(client, lambda c: c.dlq_purge(queue_name, group_name))})
