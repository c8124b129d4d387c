"""Receive and ack over the HTTP API until a group has nothing more to give."""

from __future__ import annotations

from cherami.client.asyncclient import AsyncClient


async def drain(
    client: AsyncClient, queue: str, group: str, max_messages: int = 1000, wait_seconds: float = 1
) -> list[str]:
    """Receive and ack until a receive comes back empty; the texts in delivery order."""
    texts: list[str] = []
    while got := await client.receive(
        queue, group, max_messages=max_messages, wait_seconds=wait_seconds
    ):
        texts += [m.text for m in got]
        await client.ack(queue, group, [m.receipt or "" for m in got])
    return texts
