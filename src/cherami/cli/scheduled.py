"""``cherami scheduled``: list a queue's delayed messages not due yet, and cancel them."""

from __future__ import annotations

import click

from cherami.cli.admin import echo_listing
from cherami.cli.connection import ClientFactory, connection_options, run
from cherami.cli.main import cli
from cherami.client.asyncclient import AsyncClient


@cli.group()
def scheduled() -> None:
    """A queue's delayed messages not due yet: list and cancel."""


@scheduled.command("list")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--until", help="Only messages due before this time (RFC 3339, or ms).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Show this many messages at the most.")  # fmt: skip
@click.option("--page-size", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="Messages asked of the server at once; a page at a time.")  # fmt: skip
@connection_options
def list_scheduled(
    client: ClientFactory, queue_name: str, until: str | None, limit: int, page_size: int
) -> None:
    """Show QUEUE's delayed messages that are not due yet, the first due first."""
    echo_listing(
        client,
        lambda c: c.iter_scheduled(queue_name, until, limit=limit, page_size=page_size),
        page_size,
    )


@scheduled.command("cancel")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("ids", metavar="ID...", nargs=-1, required=True)
@connection_options
def cancel(client: ClientFactory, queue_name: str, ids: tuple[str, ...]) -> None:
    """Cancel delayed messages of QUEUE by id before they are due: no group receives
    them. Prints each id cancelled; stops at the first that cannot be (not pending, or
    due within 5 s)."""

    async def each(c: AsyncClient) -> None:
        for message_id in ids:
            await c.cancel_scheduled(queue_name, message_id)
            click.echo(message_id)

    run(client, each)
