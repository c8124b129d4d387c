"""``cherami publish``: the bodies given, or each line of stdin streamed in batches
through a streaming publisher (with a progress bar on a terminal; Ctrl-C says what got in)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import click

from cherami.cli.connection import ClientFactory, connection_options, run
from cherami.cli.main import cli
from cherami.client.asyncclient import AsyncClient
from cherami.client.models import OutgoingMessage
from cherami.errors import CheramiError

T = TypeVar("T")

STDIN_BATCH = 500


def parse_attributes(pairs: tuple[str, ...]) -> dict[str, str]:
    """``k=v`` pairs into a dict (the value may contain ``=``)."""
    attributes: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not of the form key=value", param_hint="--attr")
        attributes[key] = value
    return attributes


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("bodies", metavar="[BODY]...", nargs=-1)
@click.option("--attr", "attrs", multiple=True, metavar="KEY=VALUE",
              help="An attribute of every message (repeatable).")  # fmt: skip
@click.option("--delay-seconds", type=float, default=None, help="Deliver no earlier than this.")
@click.option("--key", default=None, metavar="KEY",
              help="Ordering key of every message: a group gets them one at a time, "
              "in order.")  # fmt: skip
@click.option(
    "--expires-in-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Never deliver after this long (the message's TTL).",
)
@click.option(
    "--expires-at",
    default=None,
    metavar="TIME",
    help="Never deliver at or after TIME (RFC 3339, or ms since the epoch).",
)
@click.option("--batch-size", type=click.IntRange(1, 1000), default=STDIN_BATCH,
              show_default=True, help="Messages per batch when reading stdin.")  # fmt: skip
@connection_options
def publish(
    client: ClientFactory,
    queue_name: str,
    bodies: tuple[str, ...],
    attrs: tuple[str, ...],
    delay_seconds: float | None,
    key: str | None,
    expires_in_seconds: float | None,
    expires_at: str | None,
    batch_size: int,
) -> None:
    """Publish each BODY to QUEUE and print the message ids; without BODY, publish each
    line of stdin (streamed in batches) and print how many were published."""
    attributes = parse_attributes(attrs) or None
    if expires_in_seconds is not None and expires_at is not None:
        raise click.UsageError("give at most one of --expires-in-seconds and --expires-at")
    ttl: dict[str, Any] = {"expires_in_seconds": expires_in_seconds, "expires_at": expires_at}
    if bodies:
        messages = [OutgoingMessage(body, attributes, delay_seconds, key=key, **ttl)
                    for body in bodies]  # fmt: skip
        for message_id in run(client, lambda c: c.publish(queue_name, messages)):
            click.echo(message_id)
        return
    if sys.stdin.isatty():
        batch_size = 1  # a line typed is sent when Enter is pressed
    # a reader of its own: after Ctrl-C a thread stays blocked in it, and the interpreter
    # would abort at exit closing sys.stdin while the thread holds its lock
    stdin = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
    batches = (
        [OutgoingMessage(body, attributes, delay_seconds, key=key, **ttl) for body in batch]
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
