"""``cherami peek``: read a queue's retained messages without consuming them."""

from __future__ import annotations

import click

from cherami.cli.admin import echo_listing
from cherami.cli.connection import ClientFactory, connection_options
from cherami.cli.main import cli


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.option(
    "--since",
    help="Only messages enqueued at or after this time (RFC 3339, or ms since the epoch).",
)
@click.option("--until", help="Only messages enqueued before this time (RFC 3339, or ms).")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show this many messages at the most.",
)
@click.option("--desc", is_flag=True, help="Newest first (default: oldest first).")
@click.option(
    "--page-size",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="Messages asked of the server at once; each page is printed as it arrives.",
)
@connection_options
def peek(
    client: ClientFactory,
    queue_name: str,
    since: str | None,
    until: str | None,
    limit: int,
    desc: bool,
    page_size: int,
) -> None:
    """Show QUEUE's messages without consuming them (no group sees a change)."""
    order = "desc" if desc else "asc"
    echo_listing(
        client,
        lambda c: c.iter_peek(queue_name, since, until, order, limit=limit, page_size=page_size),
        page_size,
    )
