"""WebSocket close codes of the publish and consume streams (docs/protocol.md §6)."""

from __future__ import annotations

GOING_AWAY = 1001  # the server is stopping: reconnect (to it or another frontend)
RECONFIGURE = 4000  # what this stream served moved to another host: reconnect
DELETED = 4004  # the queue or group was deleted: do not reconnect

# codes after which a client reconnects by itself (1006: the connection dropped without
# a close frame; 1011-1013: server error, restart, try again later)
RECONNECT = frozenset({GOING_AWAY, 1006, 1011, 1012, 1013, RECONFIGURE})
