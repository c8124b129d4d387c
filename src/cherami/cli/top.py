"""``cherami top``: a live view of queues and their groups (publish, delivery and ack
rates, backlog, in flight, oldest unacked age, DLQ depth), refreshed every second from
the public API. On a terminal it redraws in place; piped, it prints one table a refresh."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from cherami.cli.connection import ClientFactory, connection_options
from cherami.cli.main import cli
from cherami.client.asyncclient import AsyncClient
from cherami.errors import Forbidden, NotFound, Unavailable


@dataclass
class Sample:
    at: float
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> GET queue
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # queue -> GETs


async def sample(client: AsyncClient, prefix: str) -> Sample:
    """One read of every queue (starting with ``prefix``) the key covers, and its groups."""
    names = [q["name"] for q in await client.list_queues() if q["name"].startswith(prefix)]
    out = Sample(time.monotonic())

    async def one(name: str) -> None:
        try:
            queue = await client.get_queue(name)
            groups = await client.list_groups(name)
            full = await asyncio.gather(*(client.get_group(name, g["name"]) for g in groups))
        except (Forbidden, NotFound):
            return  # not covered by the key, or deleted meanwhile
        out.queues[name], out.groups[name] = queue, list(full)

    await asyncio.gather(*(one(n) for n in names))
    return out


def rate(now: float | None, before: float | None, seconds: float) -> str:
    if now is None or before is None or seconds <= 0 or now < before:
        return "-"
    value = (now - before) / seconds
    return f"{value:,.0f}/s" if value >= 10 or value == 0 else f"{value:.1f}/s"


def age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def render(cur: Sample, prev: Sample | None, url: str) -> Table:
    """The table of ``cur``, with rates against ``prev`` (none on the first refresh)."""
    span = cur.at - prev.at if prev else 0.0
    stamp = time.strftime("%H:%M:%S")
    table = Table(title=f"cherami top  {url}  {stamp}  {len(cur.queues)} queues",
                  title_justify="left", header_style="bold")  # fmt: skip
    for name in ("QUEUE", "GROUP"):
        table.add_column(name, no_wrap=True)
    for name in ("PUBLISH", "DELIVER", "ACK", "BACKLOG", "IN FLIGHT", "OLDEST", "DLQ"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in sorted(cur.queues):
        queue = cur.queues[name]
        before = prev.queues.get(name) if prev else None
        published = queue["stats"]["messages_published"]
        old = before["stats"]["messages_published"] if before else None
        table.add_row(name, "", rate(published, old, span), "", "", "", "", "", "",
                      style="bold")  # fmt: skip
        earlier = {g["name"]: g["stats"] for g in (prev.groups.get(name, []) if prev else [])}
        for group in sorted(cur.groups[name], key=lambda g: str(g["name"])):
            s, p = group["stats"], earlier.get(group["name"])
            table.add_row(
                "", group["name"], "",
                rate(s["delivered"], p["delivered"] if p else None, span),
                rate(s["acked"], p["acked"] if p else None, span),
                f"{s['backlog']:,}", f"{s['in_flight']:,}", age(s["oldest_unacked_age_seconds"]),
                f"{s['dlq_depth']:,}",
            )  # fmt: skip
    if not cur.queues:
        table.caption = "no queues (or none the key covers)"
    return table


async def watch(client: AsyncClient, console: Console, interval: float, count: int,
                prefix: str) -> None:  # fmt: skip
    prev: Sample | None = None
    done = 0
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    if live:
        live.start()
    try:
        while True:
            started = time.monotonic()
            cur = await sample(client, prefix)
            table = render(cur, prev, client.url)
            if live:
                live.update(table, refresh=True)
            else:
                console.print(table)
                console.file.flush()  # a reader of the pipe sees each refresh at once
            prev, done = cur, done + 1
            if count and done >= count:
                return
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    finally:
        if live:
            live.stop()


@cli.command()
@connection_options
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between refreshes.")  # fmt: skip
@click.option("--count", type=click.IntRange(min=0), default=0, show_default=True,
              help="Stop after this many refreshes (0: until Ctrl-C).")  # fmt: skip
@click.option("--queue", "prefix", default="", help="Only queues whose name starts with this.")
def top(client: ClientFactory, interval: float, count: int, prefix: str) -> None:
    """A live view of queues and groups: rates, backlog, in flight, oldest age, DLQ."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)

    async def main() -> None:
        async with client() as c:
            await watch(c, console, interval, count, prefix)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except TimeoutError:
        raise Unavailable("the server did not answer in time") from None
