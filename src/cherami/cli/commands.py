"""Client commands of the CLI: ``queue``, ``group``, ``publish``, ``consume``, ``dlq``,
``peek`` and ``scheduled``.

Every command takes ``--url`` (``CHERAMI_URL``) and ``--api-key`` (``CHERAMI_API_KEY``).
``show``/``list`` print pretty JSON; errors print one line on stderr and exit 1.

Importing this module registers them on ``cli``: admin.py (``queue``, ``group``),
publish.py, consume.py (``consume``, ``ack``, ``nack``), dlq.py, peek.py and scheduled.py;
connection.py has
what they share."""

from __future__ import annotations

from cherami.cli.admin import group, queue
from cherami.cli.connection import ClientFactory, connection_options, echo_json, run
from cherami.cli.consume import ack_command, consume, message_json, nack_command
from cherami.cli.dlq import dlq
from cherami.cli.peek import peek
from cherami.cli.publish import parse_attributes, publish, read_batches
from cherami.cli.scheduled import scheduled

__all__ = [
    "ClientFactory",
    "ack_command",
    "connection_options",
    "consume",
    "dlq",
    "echo_json",
    "group",
    "message_json",
    "nack_command",
    "parse_attributes",
    "peek",
    "publish",
    "queue",
    "read_batches",
    "run",
    "scheduled",
]
