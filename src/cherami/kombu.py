"""A kombu transport, so a Celery app moves to Cherami by its ``broker_url``.

``import cherami.kombu`` registers the ``cherami`` scheme with kombu; then
``broker_url = "cherami://HOST:PORT"`` (``cherami+https://HOST:PORT`` for TLS, the API
key as the URL's password or ``broker_transport_options={"api_key": ...}``). docs/celery.md
is the user's guide; the code is in ``cherami.celery``. In short:

- each kombu queue is a Cherami queue of the same name (characters a name cannot hold are
  written ``_XX``), read through one consumer group, ``celery`` unless the transport
  option ``consumer_group`` names another;
- a publish goes on a streaming publisher and returns once the message is durable; a
  message whose Celery ``eta`` (a ``countdown`` too) is ahead is published as a Cherami
  delayed message, due at that time;
- a consumed queue is a streaming consumer whose credit is the channel's prefetch count;
  an ack is a stream ack, a reject or a requeue a nack (delivered again until the
  group's ``max_delivery_count``, then moved to its DLQ), and every delivery the worker
  holds has its visibility extended until it is settled;
- a fanout exchange is the Cherami queue ``kombu.fanout.EXCHANGE``, whose groups are the
  queues bound to it (Celery's remote control, ``Broadcast`` queues), and a
  direct binding is also written as a group of a ``kombu.bind.EXCHANGE.KEY`` queue and a
  topic binding as a group of ``kombu.topic.EXCHANGE``, so that other processes route to
  them (Celery's remote-control replies, task events).
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from cherami.celery.channel import Channel
from cherami.celery.mapping import cherami_name
from cherami.celery.transport import Transport

__all__ = ["Channel", "Transport", "cherami_name"]

TRANSPORT_ALIASES["cherami"] = "cherami.kombu:Transport"
