"""How a Spark job proves itself to the store hosts it reads (docs/spark.md,
"Authentication"): with read grants that the frontend issues for the job's API key
(``POST /v1/queues/{queue}/read-grants``), or, when the driver's environment holds the
cluster secret, with the cluster key.

The driver asks for one grant per extent it plans to read, all in one request, keeps each
until two thirds of its lifetime have passed and then asks again, so a long streaming
query never hands a worker a grant about to expire and a new micro-batch costs no
request. A partition carries its extent's grant and the ``GrantSource`` it came from: a
worker whose grant went stale (a task retried long after it was planned, a read that
outlasts the grant) asks for a new one itself."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from cherami.errors import Unavailable
from cherami.spark.control import ControlClient
from cherami.spark.options import Options
from cherami.wire import handshake as h
from cherami.wire.grants import ReadGrant

Credential = bytes | ReadGrant  # the cluster key, or a read grant
ASK_FOR = 15.0  # seconds a grant request is retried while the frontend is unavailable


@dataclass(frozen=True, slots=True)
class GrantSource:
    """Where grants come from: picklable, so partitions carry it to the workers."""

    url: str
    api_key: str | None
    queue: str
    lifetime: float | None = None  # seconds; None: the frontend's default

    def ask(self, extents: list[str]) -> dict[str, ReadGrant]:
        """A grant per extent; a frontend that is briefly away (a restart) is asked
        again for up to ASK_FOR seconds."""
        control = ControlClient(self.url, self.api_key)
        deadline = time.monotonic() + ASK_FOR
        pause = 0.1
        while True:
            try:
                return control.read_grants(self.queue, extents, self.lifetime)
            except Unavailable:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(2.0, pause * 2)

    def renew(self, extent: str) -> ReadGrant:
        return self.ask([extent])[extent]


def grant_source(options: Options) -> GrantSource:
    return GrantSource(options.url, options.api_key, options.queue, options.grant_lifetime)


def cluster_key() -> bytes | None:
    """The cluster key when this process's environment holds the secret, else None."""
    try:
        return h.cluster_key()
    except h.NoSecret:
        return None


class ReadAccess:
    """The driver's side: the credential each partition carries."""

    def __init__(self, source: GrantSource) -> None:
        self.source = source
        self.key = cluster_key()  # with the secret at hand, the direct path
        self._grants: dict[str, ReadGrant] = {}

    @property
    def renewer(self) -> GrantSource | None:
        """What a worker renews a grant with (None on the direct path)."""
        return None if self.key is not None else self.source

    def credentials(self, extents: Iterable[str]) -> dict[str, Credential]:
        wanted = list(dict.fromkeys(extents))
        if self.key is not None:
            return dict.fromkeys(wanted, self.key)
        now_ms = time.time() * 1000
        self._grants = {e: g for e, g in self._grants.items() if g.expires_ms > now_ms}
        missing = [e for e in wanted if e not in self._grants or self._grants[e].stale(now_ms)]
        if missing:
            self._grants.update(self.source.ask(missing))
        return {e: self._grants[e] for e in wanted}
