"""A small synchronous client of the store protocol, for Spark workers.

Workers are plain Python processes without an event loop; they read one extent range
from one of its replicas over a blocking socket, with ``Read`` frames (wire/store.py)
in length-prefixed framing (wire/framing.py). Two reads are kept in flight so the store
host scans the next batch while the worker decodes this one. When a replica fails the
reader goes on from the last key it got, on the next replica.

A reader proves itself with the cluster key or a read grant (spark/access.py); with a
``renew`` call it asks for a new grant before its grant expires, and when a store host
says it has."""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cherami.errors import CheramiError, GrantExpired, ProtocolError, Unavailable, error_from_code
from cherami.wire import grants, tls
from cherami.wire import handshake as h
from cherami.wire import store as w
from cherami.wire.framing import MAX_FRAME, pack_frame
from cherami.wire.keys import plain_key, seq_of, timer_key

log = logging.getLogger("cherami.spark.storereader")

READ_BATCH = 4096
READ_BYTES = 4 << 20
IN_FLIGHT = 2
STALLS_PER_REPLICA = 20
_HEADER = struct.Struct(">I")


class DataLost(CheramiError):
    """Records a read still wanted are gone (retention deleted the extent)."""


@dataclass(frozen=True, slots=True)
class Batch:
    keys: list[bytes]
    records: list[bytes]


class _Connection:
    """One blocking connection to a store host; replies come back by request id."""

    def __init__(
        self,
        address: str,
        timeout: float,
        credential: bytes | grants.ReadGrant,
        tls_cadata: str | None = None,
    ) -> None:
        """``address``: ``host:port``, or ``tls://host:port`` for a store host serving
        TLS, verified with the PEM ``tls_cadata`` (else the system's trust store);
        ``credential``: the cluster key or a read grant."""
        self.address = address
        secure = address.startswith("tls://")
        host, port = address.removeprefix("tls://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if secure:
            context = tls.client_context(cadata=tls_cadata)
            try:
                sock = context.wrap_socket(sock, server_hostname=host)
            except (ssl.SSLError, OSError) as err:
                sock.close()
                raise Unavailable(f"store {address}: TLS: {err}") from err
        self._sock = sock
        if isinstance(credential, grants.ReadGrant):  # prove the frontend granted the read
            hello, nonce = grants.hello(credential)
            key, what = credential.key, "read grant (of another cluster?)"
        else:  # prove this worker belongs to the cluster
            (hello, nonce), key = h.hello(credential), credential
            what = "cluster hello (a different cluster secret?)"
        self._sock.sendall(hello)
        try:
            answer = self._exactly(h.WELCOME_SIZE)
        except Unavailable:
            self.close()
            raise Unavailable(f"store {address} refused the {what}") from None
        if not h.welcome_ok(key, nonce, bytes(answer)):
            self.close()
            raise Unavailable(f"store {address} is not of this cluster")
        self._rids = itertools.count(1)
        self._early: dict[int, w.Reply] = {}

    def send_read(self, extent: str, after: bytes, max_count: int, until_ms: int = 0) -> int:
        rid = next(self._rids)
        frame = w.Read(rid, extent, after, max_count, until_ms, 0, READ_BYTES)
        self._sock.sendall(pack_frame(w.encode(frame)))
        return rid

    def reply(self, rid: int) -> w.Reply:
        while rid not in self._early:
            reply = w.decode_reply(self._frame())
            self._early[reply.rid] = reply
        return self._early.pop(rid)

    def _frame(self) -> bytearray:
        (size,) = _HEADER.unpack(self._exactly(4))
        if size > MAX_FRAME:
            raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
        return self._exactly(size)

    def _exactly(self, size: int) -> bytearray:
        """``size`` bytes (not copied again: the decoders read a bytearray as well)."""
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:], size - got)
            if n == 0:
                raise Unavailable(f"store {self.address} closed the connection")
            got += n
        return buf

    def close(self) -> None:
        self._sock.close()


def _result(reply: w.Reply) -> w.ReadResult:
    if isinstance(reply, w.Failed):  # unavailable, forbidden, grant_expired, ...
        raise error_from_code(reply.code, f"store read failed: {reply.code}: {reply.message}")
    if not isinstance(reply, w.ReadResult):
        raise ProtocolError(f"unexpected reply {type(reply).__name__} to a read")
    return reply


class StoreReader:
    """Reads extents from any of the given replica addresses, failing over between them."""

    def __init__(
        self,
        addresses: list[str],
        timeout: float = 30.0,
        retries: int = 6,
        credential: bytes | grants.ReadGrant | None = None,
        tls_cadata: str | None = None,
        renew: Callable[[], grants.ReadGrant] | None = None,
    ) -> None:
        """``credential``: the cluster key (wire/handshake.py; default this process's)
        or a read grant (wire/grants.py), which ``renew`` replaces in time."""
        if not addresses:
            raise Unavailable("no store host address for this extent")
        self._addresses = addresses
        self._timeout = timeout
        self._retries = retries
        self._credential = credential if credential is not None else h.cluster_key()
        self._renew = renew
        self._cadata = tls_cadata
        self._turn = 0
        self._conn: _Connection | None = None

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _renew_due(self) -> bool:
        grant = self._credential
        return self._renew is not None and isinstance(grant, grants.ReadGrant) and grant.stale()

    def _connection(self) -> _Connection:
        if self._renew is not None and self._renew_due():
            self.close()  # a grant is shown as a connection opens: a new grant, a new one
            self._credential = self._renew()
        if self._conn is None:
            address = self._addresses[self._turn % len(self._addresses)]
            self._conn = _Connection(address, self._timeout, self._credential, self._cadata)
        return self._conn

    def _expired(self, err: GrantExpired, attempt: int) -> None:
        """A store host says the grant expired (a clock ahead of ours): a new one."""
        if self._renew is None or attempt + 1 >= self._retries:
            raise err
        log.warning("store read: %s; renewing the grant", err)
        self.close()
        self._credential = self._renew()

    def _failed(self, err: Exception, attempt: int) -> None:
        log.warning("store read failed (attempt %d): %s", attempt + 1, err)
        self.close()
        self._turn += 1
        if attempt + 1 >= self._retries:
            raise Unavailable(f"extent read failed on every replica: {err}") from err
        time.sleep(min(2.0, 0.1 * 2**attempt))

    def read_range(self, extent: str, start_seq: int, end_seq: int) -> Iterator[Batch]:
        """Records ``start_seq`` up to (not including) ``end_seq`` of a plain extent."""
        last = end_seq - 1
        attempt = stalls = 0
        while start_seq <= last:
            got = 0
            try:
                for batch in self._pipelined(extent, start_seq, last):
                    start_seq = seq_of(batch.keys[-1]) + 1
                    got += len(batch.keys)
                    yield batch
            except GrantExpired as err:
                self._expired(err, attempt)
                attempt += 1
                continue
            except (OSError, Unavailable) as err:
                self._failed(err, attempt)
                attempt += 1
                continue
            attempt = 0
            stalls = 0 if got else stalls + 1
            if stalls and stalls % STALLS_PER_REPLICA == 0:
                self.close()  # this replica has not caught up: try the next one
                self._turn += 1
            if stalls >= STALLS_PER_REPLICA * 2 * len(self._addresses):
                raise Unavailable(f"extent {extent}: seq {start_seq} is on no replica")
            if stalls:
                time.sleep(0.05)

    def _pipelined(self, extent: str, first: int, last: int) -> Iterator[Batch]:
        """Reads of fixed ranges of a plain extent, ``IN_FLIGHT`` at once. Ends early when
        a reply is short (a byte limit or a lagging replica): the caller asks again."""
        conn = self._connection()
        pending: list[tuple[int, int, int]] = []  # (rid, first seq, count)
        next_seq = first
        while next_seq <= last or pending:
            # a stale grant: no new reads here, the caller goes on on a new connection
            while next_seq <= last and len(pending) < IN_FLIGHT and not self._renew_due():
                count = min(READ_BATCH, last - next_seq + 1)
                after = plain_key(next_seq - 1) if next_seq > 1 else b""
                pending.append((conn.send_read(extent, after, count), next_seq, count))
                next_seq += count
            if not pending:
                return
            rid, _, count = pending.pop(0)
            result = _result(conn.reply(rid))
            if result.keys:
                yield Batch(result.keys, result.records)
            if len(result.keys) < count:
                for stale, _, _ in pending:  # drop replies to reads past the gap
                    conn.reply(stale)
                if result.end:
                    raise DataLost(
                        f"extent {extent} ends before seq {last}: sealed lower or dropped"
                    )
                return

    def read_all(self, extent: str) -> Iterator[Batch]:
        """Every record the replica holds now, in key order (plain or timer extents)."""
        return self._scan(extent, b"", 0)

    def read_due(self, extent: str, from_ms: int, to_ms: int) -> Iterator[Batch]:
        """The records of a timer extent due at ``from_ms`` or later and before ``to_ms``
        (timer keys sort by due time)."""
        return self._scan(extent, timer_key(from_ms, 0), to_ms - 1)

    def has_due(self, extent: str, from_ms: int, to_ms: int) -> bool:
        """Whether a timer extent holds a record due in ``[from_ms, to_ms)``."""
        conn = self._connection()
        rid = conn.send_read(extent, timer_key(from_ms, 0), 1, to_ms - 1)
        return bool(_result(conn.reply(rid)).keys)

    def _scan(self, extent: str, after: bytes, until_ms: int) -> Iterator[Batch]:
        """Records after key ``after`` (and due by ``until_ms``, unless 0) in key order."""
        attempt = 0
        while True:
            try:
                conn = self._connection()
                result = _result(conn.reply(conn.send_read(extent, after, READ_BATCH, until_ms)))
            except GrantExpired as err:
                self._expired(err, attempt)
                attempt += 1
                continue
            except (OSError, Unavailable) as err:
                self._failed(err, attempt)
                attempt += 1
                continue
            attempt = 0
            if not result.keys:
                return
            after = result.keys[-1]
            yield Batch(result.keys, result.records)
