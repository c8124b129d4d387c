"""Consuming from a group spread over output hosts (a cluster holds each extent of a
group on one output host, outputhost/ownership.py).

- The routing call (``GET .../groups/{group}/consumers``) names the live output hosts
  that serve the group; a stream consumer connects to each of them directly.
- An HTTP receive through any frontend asks the group's holders in turn, those that
  returned messages lately first, and long-polls them one at a time.
- A receipt names the output host that issued it (its tag, outputhost/receipts.py): a
  settle request is split by host, each part sent to its host, the answers merged.
- A group's stats are the sum of its holders' stats.

A request that carries ``direct=1`` is served by the process it reaches, never routed
on: it is one part of a routed request, or a stream consumer's direct connection."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from cherami.errors import CheramiError, Unavailable, error_from_response
from cherami.membership import OUTPUTHOST
from cherami.metadata.models import Group
from cherami.roles.frontend import schemas as s
from cherami.roles.frontend.context import Frontend
from cherami.roles.frontend.proxy import Router
from cherami.roles.outputhost.client import TOP_KEYS, host_tag, tag_of

log = logging.getLogger("cherami.frontend.consumerrouting")

REFRESH_SECONDS = 10  # how often a stream consumer reads the route again
DIRECT = "direct"
EMPTY_BACKOFF = 1.0  # a holder that returned nothing is asked after the others for this long
NO_HOLDER_WAIT = 1.0  # a receive for a group nobody holds (yet) looks again this often
POLL_SLICE = 0.5  # a long poll waits on one holder this long, then asks them all again
_HEADERS = ("Authorization", "Content-Type")
_EMPTY = b'{"messages":[]}'
_json = msgspec.json.Encoder()

Settled = tuple[int, list[str]]  # how many were applied, the stale receipts
LocalSettle = Callable[[list[str]], Awaitable[Settled]]


def is_direct(request: web.Request) -> bool:
    return request.query.get(DIRECT) == "1"


def _direct_path(request: web.Request) -> str:
    return str(request.rel_url.update_query({DIRECT: "1"}))


def _headers(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k in _HEADERS}


class ConsumerRouting:
    def __init__(self, frontend: Frontend) -> None:
        self.f = frontend
        self._turn = 0
        self._empty_until: dict[tuple[str, str, str], float] = {}  # (queue, group, address)

    def _routed(self, request: web.Request) -> Router | None:
        """The router, when this request is to be routed over the group's holders."""
        router = self.f.r.router
        return None if router is None or is_direct(request) else router

    def _is_self(self, router: Router, address: str) -> bool:
        return self.f.r.outputs is not None and address == router.address

    # the routing call
    async def consumers(self, request: web.Request) -> web.Response:
        group = await self.f.group_record(request, "consume")
        router = self.f.r.router
        hosts = [] if router is None else await router.output_hosts(group.queue, group.name)
        route = {
            "output_hosts": [{"address": address, "extents": n} for _, address, n in hosts],
            "refresh_seconds": REFRESH_SECONDS,
        }
        return web.Response(body=_json.encode(route), content_type="application/json")

    # receive
    async def receive(
        self,
        request: web.Request,
        group: Group,
        wait: float,
        local: Callable[[float], Awaitable[web.Response]],
        body_for: Callable[[float], Any],
    ) -> web.Response | None:
        """Serve a receive from the group's holders, here (``local``) or elsewhere;
        None when it is not to be routed. Each holder is asked without waiting, those
        that returned messages lately first; with nothing anywhere, the long poll
        waits on one holder at a time, POLL_SLICE seconds each, until ``wait`` is up."""
        router = self._routed(request)
        if router is None:
            return None
        deadline = time.monotonic() + wait
        key = (group.queue, group.name)
        while True:
            hosts = await router.output_hosts(*key)
            remaining = deadline - time.monotonic()
            if not hosts:
                await asyncio.sleep(max(0.0, min(remaining, NO_HOLDER_WAIT)))
                if time.monotonic() >= deadline:
                    return web.Response(body=_EMPTY, content_type="application/json")
                continue
            self._turn += 1
            turn = [hosts[(self._turn + i) % len(hosts)][1] for i in range(len(hosts))]
            now = time.monotonic()
            turn.sort(key=lambda a: self._empty_until.get((*key, a), 0) > now)
            error: web.Response | None = None
            for address in turn:
                reply = await self._receive_at(
                    router, request, group, address, 0.0, local, body_for
                )
                if reply.status == 200 and reply.body != _EMPTY:
                    return reply
                error = error if reply.status == 200 else reply
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return error or web.Response(body=_EMPTY, content_type="application/json")
            slice_ = min(remaining, POLL_SLICE)
            reply = await self._receive_at(router, request, group, turn[0], slice_, local, body_for)
            if reply.status == 200 and reply.body != _EMPTY:
                return reply
            if time.monotonic() >= deadline:
                return reply

    async def _receive_at(
        self,
        router: Router,
        request: web.Request,
        group: Group,
        address: str,
        wait: float,
        local: Callable[[float], Awaitable[web.Response]],
        body_for: Callable[[float], Any],
    ) -> web.Response:
        if self._is_self(router, address):
            reply = await local(wait)
        else:
            body = _json.encode(body_for(wait))
            try:
                reply = await router.send(
                    "POST", address, _direct_path(request), body, _headers(request)
                )
            except CheramiError as err:
                reply = web.Response(
                    body=_json.encode(err.to_dict()), status=err.status,
                    content_type="application/json",
                )  # fmt: skip
        self.noted(group, address, reply.status == 200 and reply.body != _EMPTY)
        return reply

    def noted(self, group: Group, address: str, returned: bool) -> None:
        """Whether a holder returned messages to a receive (or failed)."""
        key = (group.queue, group.name, address)
        if returned:
            self._empty_until.pop(key, None)
        else:
            self._empty_until[key] = time.monotonic() + EMPTY_BACKOFF

    # settle
    async def settle(
        self,
        request: web.Request,
        receipts: list[str],
        local: LocalSettle,
        body_for: Callable[[list[str]], Any],
        path: str | None = None,
    ) -> Settled:
        """Apply a settlement (ack, nack, extend) where each receipt was issued: here,
        or by the output host its tag names. A receipt of a host that is not alive is
        stale. A host's error answer (503 while its extents move) is the answer, once
        every part has been tried. ``path``: the settle's path at the output hosts, when
        the request is not itself that settle (a receive giving back what it took)."""
        router = self._routed(request)
        if router is None:
            return await local(receipts)
        parts: dict[str, list[str]] = {}
        for receipt in receipts:
            parts.setdefault(tag_of(receipt), []).append(receipt)
        live = {host_tag(h.id): h.address for h in await router.live(OUTPUTHOST)}
        stale: list[str] = []
        calls: list[Awaitable[Settled]] = []
        for tag, part in parts.items():
            address = live.get(tag) if tag else None
            if address is None:
                stale += part
            elif self._is_self(router, address):
                calls.append(local(part))
            else:
                body = _json.encode(body_for(part))
                calls.append(self._settle_at(router, request, address, body, path))
        applied = 0
        error: CheramiError | None = None
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, CheramiError):
                error = error or result
            elif isinstance(result, BaseException):
                raise result
            else:
                applied += result[0]
                stale += result[1]
        if error is not None:
            raise error
        return applied, stale

    async def _settle_at(
        self, router: Router, request: web.Request, address: str, body: bytes, path: str | None
    ) -> Settled:
        path = _direct_path(request) if path is None else f"{path}?{DIRECT}=1"
        reply = await router.send("POST", address, path, body, _headers(request))
        raw = reply.body if isinstance(reply.body, bytes) else b""
        if reply.status != 200:
            raise error_from_response(reply.status, raw)
        try:
            answer = msgspec.json.decode(raw)
            applied = next(v for k, v in answer.items() if k != "stale")
            return int(applied), list(answer["stale"])
        except (msgspec.DecodeError, AttributeError, KeyError, StopIteration, TypeError) as err:
            raise Unavailable(f"output host {address} answered a settle oddly: {err}") from err

    # stats
    async def stats(
        self,
        request: web.Request,
        group: Group,
        local: Callable[[], Awaitable[s.GroupStats]],
        persisted: Callable[[], Awaitable[s.GroupStats]],
    ) -> s.GroupStats:
        """The group's stats: this process's own, or in a cluster the sum over the
        output hosts holding its extents (the oldest unacked message of any of them),
        or with none holding it the backlog by its persisted ack levels."""
        router = self._routed(request)
        if router is None:
            return await local()
        hosts = await router.output_hosts(group.queue, group.name)
        calls = [
            local() if self._is_self(router, address) else self._stats_at(router, request, address)
            for _, address, _ in hosts
        ]
        parts = await asyncio.gather(*calls)
        if not parts:
            return await persisted()
        return s.GroupStats(
            backlog=sum(p.backlog for p in parts),
            in_flight=sum(p.in_flight for p in parts),
            dlq_depth=parts[0].dlq_depth,
            oldest_unacked_age_seconds=max(p.oldest_unacked_age_seconds for p in parts),
            delivered=sum(p.delivered for p in parts),
            acked=sum(p.acked for p in parts),
            redelivered=sum(p.redelivered for p in parts),
            top_keys=s.top_keys([p.top_keys for p in parts], TOP_KEYS),
            expired=sum(p.expired for p in parts),
            cancelled=sum(p.cancelled for p in parts),
        )

    async def _stats_at(self, router: Router, request: web.Request, address: str) -> s.GroupStats:
        reply = await router.send("GET", address, _direct_path(request), b"", _headers(request))
        raw = reply.body if isinstance(reply.body, bytes) else b""
        if reply.status != 200:
            raise error_from_response(reply.status, raw)
        return msgspec.json.decode(raw, type=_GroupWithStats).stats


class _GroupWithStats(msgspec.Struct):
    stats: s.GroupStats
