"""The ack-level upsert both stores write (an output host's committer, a DLQ merge)."""

from __future__ import annotations

from typing import Any

from cherami.metadata.models import AckLevel


def put_ack_level_sql(mark: str) -> str:
    """The upsert of one ack-level row, in the store's parameter ``mark``. A level never
    moves backward; a merged DLQ range (``lim``) only grows, and lands even when the
    level it came with is behind the stored one (a merge reads the group's levels while
    its consumers go on acking)."""
    marks = ", ".join([mark] * 6)
    return (
        f"INSERT INTO ack_levels VALUES ({marks}) "
        "ON CONFLICT (queue, grp, extent) DO UPDATE SET "
        "level = CASE WHEN excluded.acked >= ack_levels.acked THEN excluded.level "
        "ELSE ack_levels.level END, "
        "acked = CASE WHEN excluded.acked >= ack_levels.acked THEN excluded.acked "
        "ELSE ack_levels.acked END, "
        "lim = CASE WHEN ack_levels.lim IS NULL OR excluded.lim > ack_levels.lim "
        "THEN excluded.lim ELSE ack_levels.lim END "
        "WHERE excluded.acked >= ack_levels.acked OR excluded.lim > ack_levels.lim "
        "OR (ack_levels.lim IS NULL AND excluded.lim IS NOT NULL)"
    )


def level_row(a: AckLevel) -> tuple[Any, ...]:
    """An ack level's row, in the order of ``put_ack_level_sql``'s parameters."""
    return (a.queue, a.group, a.extent, a.level, a.acked, a.limit)
