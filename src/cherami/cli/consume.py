"""``cherami consume``, ``ack`` and ``nack``: receive messages of a consumer group as
JSON lines, and settle deliveries by their receipts."""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

import click

from cherami.cli.connection import ClientFactory, connection_options, echo_json, run
from cherami.cli.main import cli
from cherami.client.asyncclient import AsyncClient
from cherami.client.models import Received

MAX_WAIT_PER_RECEIVE = 20.0


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
