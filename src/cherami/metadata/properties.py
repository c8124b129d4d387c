"""Queue properties (``MetadataStore.get_queue_properties``): names and values kept with
a queue for what Cherami itself never reads, such as the SQS endpoint's tags, long-poll
default, redrive target and message move tasks. They are deleted with the queue, and
written only while it exists. The statements here are the two stores' shared SQL, given
each store's parameter marker."""

from __future__ import annotations

from typing import Any

from cherami.metadata.base import prefix_end

Statement = tuple[str, tuple[Any, ...]]


def select_properties(queue: str, prefix: str, mark: str) -> Statement:
    sql = f"SELECT name, value FROM queue_properties WHERE queue = {mark}"
    args: tuple[Any, ...] = (queue,)
    if prefix:
        sql += f" AND name >= {mark}"
        args += (prefix,)
        end = prefix_end(prefix)
        if end is not None:
            sql += f" AND name < {mark}"
            args += (end,)
    return sql + " ORDER BY name", args


def find_properties(name: str, value: str | None, mark: str) -> Statement:
    if value is None:
        return f"SELECT queue, value FROM queue_properties WHERE name = {mark}", (name,)
    return (
        f"SELECT queue, value FROM queue_properties WHERE name = {mark} AND value = {mark}",
        (name, value),
    )


def write_properties(
    queue: str, values: dict[str, str], delete: list[str], mark: str
) -> list[Statement]:
    """The deletes, then the upserts (run after the queue was seen to exist, in the
    same transaction)."""
    statements: list[Statement] = [
        (f"DELETE FROM queue_properties WHERE queue = {mark} AND name = {mark}", (queue, name))
        for name in delete
        if name not in values
    ]
    upsert = (
        f"INSERT INTO queue_properties VALUES ({mark}, {mark}, {mark}) "
        "ON CONFLICT (queue, name) DO UPDATE SET value = excluded.value"
    )
    statements += [(upsert, (queue, name, value)) for name, value in values.items()]
    return statements
