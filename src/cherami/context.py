"""One process's context: its timing, its clock, its cluster key and its TLS contexts.

The process shell (server/: a node, a role process) builds one ``ProcessContext`` at
start, from its config and its cluster secret, and passes it to the roles it assembles;
each role keeps what it needs of it from construction on. Nothing here is a module
global: two contexts live side by side in one interpreter (a test may build two
processes in one), and a test hands a role a context with a clock it advances by hand
(``clock``: monotonic seconds, what leases, acting windows, the outage rule and
visibility timeouts are timed by) instead of sleeping. ``DEFAULT`` is the context of
whatever is built without one: the default timing, the real clock, the key of the
environment (wire/handshake.py) and plain TCP."""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from cherami.timing import DEFAULT as DEFAULT_TIMING
from cherami.timing import Timing
from cherami.wire import handshake as h
from cherami.wire import tls


@dataclass(frozen=True, kw_only=True)
class ProcessContext:
    timing: Timing = DEFAULT_TIMING
    clock: Callable[[], float] = time.monotonic
    key: bytes | None = None  # the cluster key (None: the environment's, handshake.py)
    tls_server: ssl.SSLContext | None = None  # what the listeners serve TLS with
    tls_client: ssl.SSLContext | None = None  # what internal clients verify peers with

    @classmethod
    def of(
        cls,
        timing: Timing,
        secret: bytes | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> ProcessContext:
        """A process's context from its config (the timing checked): with a cert,
        listeners serve TLS and internal clients verify with ``tls_ca``."""
        timing.check()
        server = client = None
        if tls_cert and tls_key:
            server, client = tls.server_context(tls_cert, tls_key), tls.client_context(tls_ca)
        key = h.derive_key(secret) if secret is not None else None
        return cls(timing=timing, clock=clock, key=key, tls_server=server, tls_client=client)

    def cluster_key(self) -> bytes:
        """The key internal links prove (handshake.py); h.NoSecret without one."""
        return self.key if self.key is not None else h.cluster_key()

    def internal_headers(self) -> dict[str, str]:
        """The header internal HTTP requests carry instead of an API key."""
        return {h.INTERNAL_HEADER: h.internal_token(self.cluster_key())}

    def internal_ok(self, header: str | None) -> bool:
        """Whether an internal route's header carries this cluster's token."""
        return h.internal_ok(self.cluster_key(), header)

    @property
    def http_scheme(self) -> str:
        return "https" if self.tls_client is not None else "http"

    @property
    def ws_scheme(self) -> str:
        return "wss" if self.tls_client is not None else "ws"


DEFAULT = ProcessContext()
