"""Publish, receive and settle over HTTP (consumerrouting.py spreads receive and
settle over a cluster's output hosts)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from cherami.errors import CheramiError
from cherami.httpbase import caller_gone, decode, json_response
from cherami.metadata.models import Group, check_competing
from cherami.roles.frontend import schemas as s
from cherami.roles.frontend.auth import KeyRing
from cherami.roles.frontend.consumerrouting import ConsumerRouting
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import received, to_messages
from cherami.roles.frontend.metrics import Metrics
from cherami.roles.frontend.throttle import Throttle
from cherami.roles.outputhost.client import OutputHostClient, Settlement

log = logging.getLogger("cherami.frontend.messages")
_received = msgspec.json.Decoder(s.ReceiveResponse)


class MessageHandlers:
    def __init__(
        self,
        lookup: Lookup,
        keys: KeyRing,
        throttle: Throttle,
        metrics: Metrics,
        outputs: OutputHostClient | None,
        routing: ConsumerRouting,
    ) -> None:
        self.lookup = lookup
        self.keys = keys
        self.throttle = throttle
        self.metrics = metrics
        self.outputs = outputs
        self.routing = routing

    async def publish(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        queue = await self.lookup.queue(request, "produce")
        body = await decode(request, s.PublishRequest, empty_ok=False)
        messages = to_messages(queue, body.messages)
        inputs = await self.lookup.input_host(queue)
        key = self.keys.find(request.headers.get("Authorization"))
        size = sum(len(m.body) for m in messages)
        await self.throttle.admit(queue, key, len(messages), size, fresh=True)
        ids = await inputs.publish(queue, messages)
        self.metrics.published(queue.name, len(ids), time.perf_counter() - started)
        return json_response(s.PublishResponse(ids))

    async def receive(self, request: web.Request) -> web.Response:
        self.metrics.receiving += 1
        try:
            return await self._receive(request)
        finally:
            self.metrics.receiving -= 1

    async def _receive(self, request: web.Request) -> web.Response:
        group = check_competing(await self.lookup.group_record(request, "consume"))
        body = await decode(request, s.ReceiveRequest)

        def waiting(wait: float) -> s.ReceiveRequest:
            return msgspec.structs.replace(body, wait_seconds=wait)

        routed = await self.routing.receive(
            request, group, body.wait_seconds,
            lambda wait: self._receive_here(group, waiting(wait)), waiting,
        )  # fmt: skip
        reply = routed or await self._receive_here(group, body)
        if reply.status == 200 and caller_gone(request):
            await self._give_back(request, group, reply)
        return reply

    async def _give_back(self, request: web.Request, group: Group, reply: web.Response) -> None:
        """The caller left before the answer (a client that gave up on a long poll, or a
        frontend whose forward timed out while this output host was slow): what the
        receive took would stay invisible for its visibility timeout (60 s by default)
        with no consumer holding it (on a loaded cluster, every group a pass of
        receives asked at once). It is nacked with no delay instead (its delivery
        counted), so the next receive gets it at once."""
        if not isinstance(reply.body, bytes):
            return
        try:
            receipts = [m.receipt for m in _received.decode(reply.body).messages]
        except msgspec.DecodeError:
            return  # not a receive's answer: nothing was taken
        if not receipts:
            return
        try:
            n, _ = await self._settle(
                request, group, receipts, Settlement("nack", 0.0),
                lambda part: s.NackRequest(receipts=part, delay_seconds=0.0),
                path=request.path.rsplit("/", 1)[0] + "/nack",  # at the group's holders
            )  # fmt: skip
        except CheramiError as err:  # they come back after their visibility timeout
            log.info("receive of %s/%s: its caller left; %d messages not given back: %s",
                     group.queue, group.name, len(receipts), err)  # fmt: skip
            return
        log.info("receive of %s/%s: its caller left before the answer; %d of its %d "
                 "messages given back", group.queue, group.name, n, len(receipts))  # fmt: skip

    async def _receive_here(self, group: Group, body: s.ReceiveRequest) -> web.Response:
        if self.outputs is None:  # a direct receive to a host that serves no group
            return json_response({"messages": []})
        taken = await self.outputs.receive(
            group, body.max_messages, body.wait_seconds, body.visibility_timeout_seconds
        )
        messages = [received(e.msg_id, receipt, e.record, e.count) for e, receipt in taken]
        return json_response(s.ReceiveResponse(messages))

    async def _settle(
        self,
        request: web.Request,
        group: Group,
        receipts: list[str],
        how: Settlement,
        body_for: Callable[[list[str]], Any],
        durable: bool = True,
        path: str | None = None,
    ) -> tuple[int, list[str]]:
        """Settle by receipt: here, or at the output host each receipt names. With
        ``durable``, answered once what was applied is persisted."""

        async def local(part: list[str]) -> tuple[int, list[str]]:
            if self.outputs is None:
                return 0, part
            return await self.outputs.settle(group, part, how, durable)

        return await self.routing.settle(request, receipts, local, body_for, path)

    async def ack(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, "consume")
        body = await decode(request, s.AckRequest, empty_ok=False)
        n, stale = await self._settle(
            request, group, body.receipts, Settlement("ack"),
            lambda part: s.AckRequest(receipts=part),
        )  # fmt: skip
        return json_response(s.AckResponse(n, stale))

    async def nack(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, "consume")
        body = await decode(request, s.NackRequest, empty_ok=False)
        # answered once the messages are parked durably (their rows are written)
        n, stale = await self._settle(
            request, group, body.receipts,
            Settlement("nack", body.delay_seconds),
            lambda part: s.NackRequest(receipts=part, delay_seconds=body.delay_seconds),
        )  # fmt: skip
        return json_response(s.NackResponse(n, stale))

    async def visibility(self, request: web.Request) -> web.Response:
        group = await self.lookup.group_record(request, "consume")
        body = await decode(request, s.VisibilityRequest, empty_ok=False)
        seconds = body.visibility_timeout_seconds
        n, stale = await self._settle(
            request, group, body.receipts,
            Settlement("extend", seconds),
            lambda part: s.VisibilityRequest(receipts=part, visibility_timeout_seconds=seconds),
            durable=False,
        )  # fmt: skip
        return json_response(s.VisibilityResponse(n, stale))
