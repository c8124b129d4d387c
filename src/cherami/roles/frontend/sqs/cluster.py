"""A group's output hosts in a cluster, for the SQS endpoint: a receive asks the hosts
that hold the group's extents in turn (this process's own output host directly), then
long-polls them a slice at a time; a settle goes to the host each receipt's tag names;
counts are summed over them. The other hosts are asked through the frontend's router
on the HTTP API's direct paths, as consumerrouting.py asks them."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import msgspec

from cherami.errors import CheramiError, error_from_response
from cherami.membership import OUTPUTHOST
from cherami.metadata.models import Group
from cherami.roles.frontend import schemas as s
from cherami.roles.frontend.context import Roles
from cherami.roles.frontend.proxy import Router
from cherami.roles.frontend.sqs.errors import SqsError
from cherami.roles.frontend.sqs.model import Delivery
from cherami.roles.outputhost.client import Settlement, host_tag, tag_of

POLL_SLICE = 0.5  # a long poll waits on one host this long, then asks them all again
_HEADERS = {"Content-Type": "application/json"}
_json = msgspec.json.Encoder()


class _Settled(msgspec.Struct):
    stale: list[str]
    acked: int = 0
    nacked: int = 0
    extended: int = 0


class _Stats(msgspec.Struct):
    stats: s.GroupStats


class RemoteGroups:
    def __init__(self, roles: Roles, router: Router) -> None:
        self.r = roles
        self.router = router

    def _path(self, group: Group, action: str = "") -> str:
        return f"/v1/queues/{group.queue}/groups/{group.name}{action}?direct=1"

    def _is_self(self, address: str) -> bool:
        return self.r.outputs is not None and address == self.router.address

    async def _send(self, method: str, address: str, path: str, body: bytes) -> bytes:
        """A direct call to another output host's HTTP API; its answer's body. A SigV4
        request carries no API key to pass on: the call carries the cluster's internal
        token instead (taken on direct calls only), this endpoint having checked the
        caller's key and scope itself."""
        headers = {**_HEADERS, **self.r.ctx.internal_headers()}
        reply = await self.router.send(method, address, path, body, headers)
        raw = reply.body if isinstance(reply.body, bytes) else b""
        if reply.status != 200:
            raise error_from_response(reply.status, raw)
        return raw

    async def receive(
        self, group: Group, max_messages: int, wait: float, visibility: float | None
    ) -> list[Delivery]:
        deadline = time.monotonic() + wait

        async def at(address: str, slice_: float) -> list[Delivery]:
            if self._is_self(address):
                assert self.r.outputs is not None
                taken = await self.r.outputs.receive(group, max_messages, slice_, visibility)
                return [
                    Delivery(e.msg_id, r, e.record.body, e.record.attributes or {}, e.count,
                             e.record.enqueued_ms)
                    for e, r in taken
                ]  # fmt: skip
            body = s.ReceiveRequest(
                max_messages=max_messages, wait_seconds=slice_,
                visibility_timeout_seconds=visibility,
            )  # fmt: skip
            raw = await self._send(
                "POST", address, self._path(group, "/receive"), _json.encode(body)
            )
            answer = msgspec.json.decode(raw, type=s.ReceiveResponse)
            return [
                Delivery(m.id, m.receipt, _body(m), m.attributes, m.delivery_count,
                         _ms(m.enqueued_at))
                for m in answer.messages
            ]  # fmt: skip

        while True:
            hosts = [a for _, a, _ in await self.router.output_hosts(group.queue, group.name)]
            for address in hosts:
                got = await at(address, 0.0)
                if got:
                    return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if not hosts:
                await asyncio.sleep(min(remaining, POLL_SLICE))
                continue
            got = await at(hosts[0], min(remaining, POLL_SLICE))
            if got or time.monotonic() >= deadline:
                return got

    async def settle(
        self, group: Group, receipts: list[str], how: Settlement, durable: bool
    ) -> tuple[int, list[str]]:
        parts: dict[str, list[str]] = {}
        for receipt in receipts:
            parts.setdefault(tag_of(receipt), []).append(receipt)
        live = {host_tag(h.id): h.address for h in await self.router.live(OUTPUTHOST)}
        applied, stale = 0, []
        for tag, part in parts.items():
            address = live.get(tag) if tag else None
            if address is None:
                stale += part
                continue
            if self._is_self(address):
                assert self.r.outputs is not None
                n, bad = await self.r.outputs.settle(group, part, how, durable)
            else:
                n, bad = await self._settle_at(group, address, part, how)
            applied += n
            stale += bad
        return applied, stale

    async def _settle_at(
        self, group: Group, address: str, receipts: list[str], how: Settlement
    ) -> tuple[int, list[str]]:
        body: msgspec.Struct
        if how.kind == "ack":
            action, body = "/ack", s.AckRequest(receipts=receipts)
        elif how.kind == "nack":
            action, body = "/nack", s.NackRequest(receipts=receipts, delay_seconds=how.seconds)
        else:
            action = "/visibility"
            body = s.VisibilityRequest(receipts=receipts, visibility_timeout_seconds=how.seconds)
        raw = await self._send("POST", address, self._path(group, action), _json.encode(body))
        answer = msgspec.json.decode(raw, type=_Settled)
        return answer.acked + answer.nacked + answer.extended, answer.stale

    async def counts(self, group: Group) -> tuple[int | None, int]:
        """(backlog, in flight) summed over the group's holders; None when none holds
        it or one of them cannot be asked."""
        hosts = await self.router.output_hosts(group.queue, group.name)
        if not hosts:
            return None, 0
        backlog = in_flight = 0
        for _, address, _ in hosts:
            try:
                if self._is_self(address):
                    assert self.r.outputs is not None
                    state = await self.r.outputs.state(group)
                    if state is not None:
                        backlog, in_flight = backlog + state.backlog, in_flight + state.in_flight
                    continue
                raw = await self._send("GET", address, self._path(group), b"")
                stats = msgspec.json.decode(raw, type=_Stats).stats
            except (CheramiError, SqsError):
                return None, 0  # a holder that does not answer: the persisted backlog
            backlog, in_flight = backlog + stats.backlog, in_flight + stats.in_flight
        return backlog, in_flight


def _body(m: s.ReceivedMessage) -> bytes:
    return m.body.encode() if m.body is not None else m.body_b64 or b""


def _ms(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)
