"""Clients of Cherami: ``AsyncClient`` (asyncio), ``Client`` (blocking) and ``Worker``."""

from cherami.client.asyncclient import AsyncClient
from cherami.client.models import BodyNotText, OutgoingMessage, Received
from cherami.client.stream import Publisher, StreamConsumer
from cherami.client.sync import Client, SyncConsumer, SyncPublisher, SyncWorker
from cherami.client.worker import Backoff, Worker

__all__ = [
    "AsyncClient",
    "Backoff",
    "BodyNotText",
    "Client",
    "OutgoingMessage",
    "Publisher",
    "Received",
    "StreamConsumer",
    "SyncConsumer",
    "SyncPublisher",
    "SyncWorker",
    "Worker",
]
