"""``cherami dlq``: show, merge back or purge the dead-letter queue of a consumer group."""

from __future__ import annotations

import click

from cherami.cli.connection import ClientFactory, connection_options, echo_json, run
from cherami.cli.main import cli


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
