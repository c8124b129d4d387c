"""Routing in a cluster: a request for a queue's input host or a group's output host that
this process does not serve is forwarded to the host that does (HTTP and WebSocket)."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
from aiohttp import WSMsgType, web

from cherami.context import DEFAULT, ProcessContext
from cherami.errors import CheramiError, TooManyStreams, Unavailable, error_from_code
from cherami.httpbase import upgrade
from cherami.membership import INPUTHOST, OUTPUTHOST, RecentHosts
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import OPEN, Host
from cherami.roles.outputhost.client import group_leases
from cherami.wire import close

log = logging.getLogger("cherami.frontend.proxy")

ROUTE_PATIENCE = 10.0  # how long to wait for a host to serve a new queue or group
FIND_AGAIN = (0.05, 0.5)  # the pause between looks for one, first and longest (_patiently)
FORWARD_TIMEOUT = 5.0  # a forwarded request's deadline, on top of a receive's own wait
UPSTREAM_HEARTBEAT = 2.0  # ping a forwarded stream's host this often; dead after 1.5x
HANDSHAKE_TIMEOUT = 3.0  # a forwarded stream's upgrade, answered or given up on
ALIVE_CHECK = 0.5  # how often a forward under way checks that its host still heartbeats
_HOP_HEADERS = {"Authorization", "Content-Type"}


class Router:
    def __init__(self, metadata: MetadataStore, ctx: ProcessContext = DEFAULT) -> None:
        """``ctx``: the process's timing (who is alive) and TLS (context.py)."""
        self.metadata = metadata
        self.ctx = ctx
        # the live hosts, read at most once a heartbeat interval: every forwarded request
        # asked the hosts table once or twice (after a power loss, 10,000 reads a round)
        t = ctx.timing
        self._live = {
            role: RecentHosts(metadata, role, t.dead_after, t.heartbeat_interval, load=False)
            for role in (INPUTHOST, OUTPUTHOST)
        }
        self._turn = itertools.count()
        self.forwarding: collections.Counter[str] = collections.Counter()  # in flight, by host
        self._session: aiohttp.ClientSession | None = None
        self._alive_addresses: set[str] = set()
        self._alive_at = -ALIVE_CHECK
        self.address = ""  # this process's own (advertised) address, once it listens

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None),
                connector=aiohttp.TCPConnector(ssl=self.ctx.tls_client or True),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def live(self, role: str) -> list[Host]:
        """The live input or output hosts, read at most once a heartbeat interval."""
        return await self._live[role].get()

    async def input_host(self, queue: str) -> str:
        """The address of an input host with open extents of the queue: the one with the
        fewest forwards in flight from here (ties in turn), so publishes spread by load."""

        async def find() -> str | None:
            live = {h.id: h.address for h in await self._live[INPUTHOST].get()}
            extents = await self.metadata.list_extents(queue, (OPEN,))
            addresses = sorted({live[e.input_host] for e in extents if e.input_host in live})
            if not addresses:
                return None
            least = min(self.forwarding[a] for a in addresses)
            idle = [a for a in addresses if self.forwarding[a] == least]
            return idle[next(self._turn) % len(idle)]

        return await _patiently(find, f"no input host serves queue {queue}")

    async def output_host(self, queue: str, group: str) -> str:
        """The address of a live output host that holds extents of the group, in turn."""

        async def find() -> str | None:
            hosts = await self.output_hosts(queue, group)
            return hosts[next(self._turn) % len(hosts)][1] if hosts else None

        return await _patiently(find, f"no output host serves group {queue}/{group}")

    async def output_hosts(self, queue: str, group: str) -> list[tuple[str, str, int]]:
        """The live output hosts that hold extents of the group: (id, address, how
        many of its units), by id."""
        holders = await self.metadata.lease_holders(group_leases(queue, group))
        if not holders:
            return []
        live = {h.id: h.address for h in await self._live[OUTPUTHOST].get()}
        units: dict[str, int] = {}
        for holder in holders.values():
            if holder in live:
                units[holder] = units.get(holder, 0) + 1
        return [(h, live[h], n) for h, n in sorted(units.items())]

    async def http(self, request: web.Request, address: str) -> web.Response:
        """Forward a request. A host that does not answer within FORWARD_TIMEOUT (plus
        the long-poll wait of a receive) is reported 503 ``unavailable``, so a client
        retries soon, and by then the route leads to the host that took over."""
        headers = {k: v for k, v in request.headers.items() if k in _HOP_HEADERS}
        body = await request.read()
        return await self.send(request.method, address, str(request.rel_url), body, headers)

    async def send(
        self, method: str, address: str, path: str, body: bytes, headers: dict[str, str]
    ) -> web.Response:
        """Send a request to the host at ``address`` (as ``http`` forwards one)."""
        url = f"{self.ctx.http_scheme}://{address}{path}"

        async def send() -> web.Response:
            async with self.session.request(
                method, url, data=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT + _long_poll(body)),
            ) as resp:  # fmt: skip
                reply = await resp.read()
                retry = resp.headers.get("Retry-After")  # of a 429 (throttled, backlog_full)
                return web.Response(
                    body=reply, status=resp.status, content_type=resp.content_type or None,
                    headers={"Retry-After": retry} if retry else None,
                )  # fmt: skip

        forwarded = asyncio.ensure_future(send())
        try:
            while True:  # a host that membership declares dead is given up on at once
                done, _ = await asyncio.wait({forwarded}, timeout=ALIVE_CHECK)
                if done:
                    return forwarded.result()
                # the answer is passed on the moment it comes, even while the check runs
                check = asyncio.ensure_future(self._alive(address))
                await asyncio.wait({forwarded, check}, return_when=asyncio.FIRST_COMPLETED)
                if forwarded.done():
                    check.cancel()
                    return forwarded.result()
                if not check.result():
                    raise Unavailable(f"host {address} stopped heartbeating")
        except (aiohttp.ClientError, TimeoutError) as err:
            raise Unavailable(f"host {address} did not answer: {err}") from err
        finally:
            forwarded.cancel()

    async def _alive(self, address: str) -> bool:
        """Whether an input or output host at ``address`` heartbeats (timing.dead_after); one
        membership read serves every forward under way for ALIVE_CHECK seconds. True
        when the metadata store cannot tell (a slow answer is not a dead host)."""
        loop = asyncio.get_running_loop()
        if loop.time() >= self._alive_at + ALIVE_CHECK:
            try:
                hosts = [
                    h for role in (INPUTHOST, OUTPUTHOST) for h in await self._live[role].get()
                ]
            except CheramiError:
                return True
            self._alive_addresses = {h.address for h in hosts}
            self._alive_at = loop.time()
        return address in self._alive_addresses

    async def websocket(self, request: web.Request, address: str) -> web.WebSocketResponse:
        headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):  # a paused host never answers
                upstream = await self.session.ws_connect(
                    f"{self.ctx.ws_scheme}://{address}{request.rel_url}", headers=headers,
                    max_msg_size=64 << 20,
                    heartbeat=UPSTREAM_HEARTBEAT, timeout=aiohttp.ClientWSTimeout(ws_close=2.0),
                )  # fmt: skip
        except aiohttp.WSServerHandshakeError as err:
            raise _refused(err) from err
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise Unavailable(f"host {address} did not answer: {err}") from err
        client = web.WebSocketResponse(max_msg_size=64 << 20, heartbeat=30)
        await upgrade(request, client)
        pumps = [
            asyncio.create_task(_pump(client, upstream)),
            asyncio.create_task(_pump(upstream, client)),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        results = await asyncio.gather(*pumps, return_exceptions=True)
        # the host's close frame reaches the client as it was; a host that vanished (no
        # close frame, or no pong in time) means: reconnect, the route leads elsewhere
        sent = results[1] if isinstance(results[1], tuple) else None
        code, reason = sent or (close.RECONFIGURE, b"host lost; reconnect")
        await upstream.close()
        await client.close(code=code, message=reason)
        return client


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> tuple[int, bytes] | None:
    """Copy messages until the source closes; the code and reason of its close frame
    (None when it ended without one)."""
    while True:
        msg = await source.receive()
        if msg.type == WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
        elif msg.type == WSMsgType.TEXT:
            await sink.send_str(msg.data)
        elif msg.type == WSMsgType.CLOSE:
            return int(msg.data), (msg.extra or "").encode()
        elif msg.type in (WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return None


async def _patiently(
    find: Callable[[], Awaitable[str | None]],
    message: str,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> str:
    """``find()`` again, after a pause doubling from FIND_AGAIN[0] up to FIND_AGAIN[1],
    until it finds a host or ROUTE_PATIENCE has passed. Each look reads the metadata
    store: while a power loss's extents were replaced, 24 publishes waiting at every
    0.1 s read the open extents 6,841 times in a round."""
    clock = clock or asyncio.get_running_loop().time
    deadline = clock() + ROUTE_PATIENCE
    pause = FIND_AGAIN[0]
    while True:
        found = await find()
        if found:
            return found
        if clock() >= deadline:
            raise Unavailable(message)
        await sleep(min(pause, max(0.0, deadline - clock())))
        pause = min(2 * pause, FIND_AGAIN[1])


class Forward(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by a handler whose request another host serves; the middleware forwards it."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


async def forward(router: Router, request: web.Request, address: str) -> web.StreamResponse:
    router.forwarding[address] += 1
    try:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await router.websocket(request, address)
        return await router.http(request, address)
    finally:
        router.forwarding[address] -= 1
        if router.forwarding[address] <= 0:
            del router.forwarding[address]


def _long_poll(body: bytes) -> float:
    """The ``wait_seconds`` a receive request asks for (0 for anything else)."""
    if b"wait_seconds" not in body:
        return 0.0
    try:
        wait = msgspec.json.decode(body).get("wait_seconds", 0)
    except (msgspec.DecodeError, AttributeError):
        return 0.0
    return float(wait) if isinstance(wait, int | float) and 0 < wait <= 60 else 0.0


def _refused(err: aiohttp.WSServerHandshakeError) -> CheramiError:
    """The host answered the upgrade with an HTTP error (the group was deleted, or it
    does not serve it any more): pass that on as the same API error."""
    if err.status == 404:
        return error_from_code("not_found", err.message)
    if err.status == 429:  # the host holds its max_streams: the client opens it again later
        return TooManyStreams(f"the host {err.message}".strip())
    return Unavailable(f"upgrade refused by the host: {err.status} {err.message}")
