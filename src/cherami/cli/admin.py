"""The ``queue`` and ``group`` commands: create, update, list, show and delete queues and
their consumer groups."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import click

from cherami.cli.connection import ClientFactory, connection_options, echo_json, run
from cherami.cli.main import cli
from cherami.cli.output import Listing
from cherami.client.asyncclient import AsyncClient

F = TypeVar("F", bound=Callable[..., Any])


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
