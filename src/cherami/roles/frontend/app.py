"""The frontend: the public HTTP API of shared/API.md over the other roles."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from cherami.cluster.loadmeter import has_room
from cherami.cluster.membership import STOREHOST, live_hosts
from cherami.errors import CheramiError, InvalidRequest, MessageTooLarge, Throttled, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import (
    FAILING,
    OPEN,
    SEALED,
    STREAM,
    Group,
    GroupConfig,
    GroupPatch,
    Queue,
    QueueConfig,
    QueuePatch,
    check_competing,
    check_name,
)
from cherami.roles.controller.client import ControllerClient
from cherami.roles.frontend import schemas as s
from cherami.roles.frontend.auth import KeyRing, Scope
from cherami.roles.frontend.clusterview import cluster_json
from cherami.roles.frontend.consumerrouting import ConsumerRouting
from cherami.roles.frontend.convert import body_fields, received, rfc3339, to_messages
from cherami.roles.frontend.lag import stream_lag
from cherami.roles.frontend.metrics import Metrics
from cherami.roles.frontend.openapi import openapi_document
from cherami.roles.frontend.proxy import Forward, Router, forward
from cherami.roles.frontend.throttle import Throttle
from cherami.roles.inputhost.client import InputHostClient
from cherami.roles.outputhost.client import (
    DELETED_CLOSE,
    MOVED_CLOSE,
    GroupState,
    OutputHostClient,
    Settlement,
)
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.records import decode_record

log = logging.getLogger("cherami.frontend.app")

T = TypeVar("T")
ROUTER: web.AppKey[Router | None] = web.AppKey("router")
STREAMS: web.AppKey[Any] = web.AppKey("streams")  # its StreamHandlers (open streams)
MAX_REQUEST_BYTES = 64 << 20
_json = msgspec.json.Encoder()


@dataclass
class Roles:
    """What the frontend uses: the other roles only through their clients."""

    metadata: MetadataStore
    stores: StoreDirectory
    controller: ControllerClient
    inputs: InputHostClient | None  # this process's; None: another process's (forwarded)
    outputs: OutputHostClient | None  # this process's; None: other processes' (forwarded)
    keys: KeyRing
    metrics: Metrics
    ready: Callable[[], bool]
    router: Router | None = None  # forwards what this process does not serve


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def error_response(err: CheramiError) -> web.Response:
    response = json_response(err.to_dict(), err.status)
    if isinstance(err, Throttled):
        response.headers["Retry-After"] = err.retry_after_header
    return response


async def decode(request: web.Request, type_: type[T], empty_ok: bool = True) -> T:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise MessageTooLarge(f"request body exceeds {MAX_REQUEST_BYTES} bytes") from None
    if not raw.strip():
        if empty_ok:
            raw = b"{}"
        else:
            raise InvalidRequest("a JSON body is required")
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as err:
        if "got `float`" not in str(err):
            raise InvalidRequest(str(err)) from None
        # JSON has one number type: 241.0 is the integer 241 (as JSON Schema says)
        try:
            return msgspec.convert(_integral(msgspec.json.decode(raw)), type_)
        except msgspec.ValidationError as again:
            raise InvalidRequest(str(again)) from None
    except msgspec.DecodeError as err:
        raise InvalidRequest(f"malformed JSON: {err}") from None
    except RecursionError:
        raise InvalidRequest("malformed JSON: a value is nested too deeply") from None


def _integral(value: Any) -> Any:
    """``value`` with every float that is a whole number made an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def queue_json(queue: Queue) -> dict[str, Any]:
    return {
        "name": queue.name,
        **msgspec.to_builtins(queue.config),
        "created_at": rfc3339(int(queue.created_at * 1000)),
    }


def group_json(group: Group) -> dict[str, Any]:
    return {
        "queue": group.queue,
        "name": group.name,
        **msgspec.to_builtins(group.config),
        "created_at": rfc3339(int(group.created_at * 1000)),
    }


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        try:
            return await handler(request)
        except Forward as fwd:
            router = request.app[ROUTER]
            if router is None:
                raise Unavailable("this process does not route requests") from None
            return await forward(router, request, fwd.address)
    except CheramiError as err:
        return error_response(err)
    except web.HTTPRequestEntityTooLarge:
        return error_response(MessageTooLarge(f"request body exceeds {MAX_REQUEST_BYTES} bytes"))
    except web.HTTPException as exc:
        if exc.status == 404:
            return error_response(_RouteNotFound())
        if exc.status == 400:  # e.g. a plain GET on a WebSocket path
            return json_response({"error": {"code": "invalid_request", "message": exc.text}}, 400)
        if exc.status == 405:
            answer = json_response(
                {"error": {"code": "invalid_request", "message": "method not allowed"}}, 405
            )
            allowed = getattr(exc, "allowed_methods", None) or ()
            answer.headers["Allow"] = ", ".join(sorted(allowed))
            return answer
        raise
    except ConnectionError as err:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            log.exception("unhandled error on %s %s", request.method, request.path)
            return json_response({"error": {"code": "internal", "message": "internal error"}}, 500)
        # the client went away mid-request: its doing, worth one line, not a traceback
        log.info("%s %s: the client went away (%s)", request.method, request.path, err)
        return json_response(
            {"error": {"code": "invalid_request", "message": "connection lost mid-request"}}, 400
        )
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_response({"error": {"code": "internal", "message": "internal error"}}, 500)


class _RouteNotFound(CheramiError):
    code, status = "not_found", 404

    def __init__(self) -> None:
        super().__init__("no such endpoint")


class Frontend:
    def __init__(self, roles: Roles) -> None:
        self.r = roles
        self.routing = ConsumerRouting(self)
        inputs = roles.inputs
        self.throttle = Throttle(
            roles.metadata, roles.stores, inputs.host_id if inputs else None,
            roles.metrics.refused,
        )  # fmt: skip

    def auth(self, request: web.Request, scope: Scope | None, queue: str | None) -> None:
        self.r.keys.check(request.headers.get("Authorization"), scope, queue)

    async def queue(self, request: web.Request, scope: Scope | None) -> Queue:
        name = check_name("queue", request.match_info["queue"])
        self.auth(request, scope, name)
        return await self.r.metadata.get_queue(name)

    async def served_group(self, request: web.Request, scope: Scope | None) -> Group:
        """The group, when this process's output host serves it; else Forward to an
        output host that does."""
        group = await self.group_record(request, scope)
        if self.r.outputs is not None and self.r.outputs.owns(group.queue, group.name):
            return group
        raise Forward(await self._router().output_host(group.queue, group.name))

    async def input_host(self, queue: Queue) -> InputHostClient:
        """The input host here, or Forward to one that serves the queue."""
        inputs = self.r.inputs
        if inputs is not None and await inputs.serves(queue.name):
            return inputs
        raise Forward(await self._router().input_host(queue.name))

    async def _state(self, group: Group) -> GroupState | None:
        return None if self.r.outputs is None else await self.r.outputs.state(group)

    def _router(self) -> Router:
        if self.r.router is None:
            raise Unavailable("this process does not route requests")
        return self.r.router

    # health and operations
    async def healthz(self, request: web.Request) -> web.Response:
        """200 ``ok``; 200 ``degraded`` with the store hosts below their free-disk floor
        (publishes to their extents answer 429 storage_full; the rest goes on); 503
        ``starting``."""
        if not self.r.ready():
            return json_response({"status": "starting"}, 503)
        try:
            stores = await live_hosts(self.r.metadata, STOREHOST)
        except CheramiError:
            return json_response({"status": "ok"})  # the metadata store's health is its own
        full = sorted(h.id for h in stores if not has_room(h))
        if full:
            return json_response({"status": "degraded", "storage_full": full})
        return json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        self.auth(request, None, None)
        body, content_type = await self.r.metrics.scrape(self)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document())

    async def cluster(self, request: web.Request) -> web.Response:
        self.auth(request, None, None)
        return json_response(await cluster_json(self.r.metadata))

    # queues
    async def put_queue(self, request: web.Request) -> web.Response:
        name = check_name("queue", request.match_info["queue"])
        self.auth(request, "admin", name)
        config = await decode(request, QueueConfig)
        queue, created = await self.r.controller.create_queue(name, config)
        return json_response(queue_json(queue), 201 if created else 200)

    async def list_queues(self, request: web.Request) -> web.Response:
        self.auth(request, None, None)
        queues = [q for q in await self.r.metadata.list_queues() if q.dlq_of is None]
        return json_response({"queues": [queue_json(q) for q in queues]})

    async def get_queue(self, request: web.Request) -> web.Response:
        queue = await self.queue(request, None)
        extents = await self.r.metadata.list_extents(queue.name, (OPEN, FAILING, SEALED))
        published = stored = 0
        for extent in extents:
            info = await self.r.stores.info(extent)
            published += info.last_seq
            stored += info.bytes
        stats = s.QueueStats(
            messages_published=published,
            open_extents=sum(e.status in (OPEN, FAILING) for e in extents),
            sealed_extents=sum(e.status == SEALED for e in extents),
            bytes_stored=stored,
            unconsumed_bytes=await self.throttle.backlog_bytes(queue.name),
        )
        return json_response({**queue_json(queue), "stats": stats})

    async def patch_queue(self, request: web.Request) -> web.Response:
        queue = await self.queue(request, "admin")
        patch = await decode(request, QueuePatch)
        config = msgspec.structs.replace(
            queue.config,
            **{k: v for k, v in msgspec.structs.asdict(patch).items() if v is not None},
        )
        queue.config = config
        await self.r.controller.update_queue(queue)
        if self.r.outputs is not None:
            self.r.outputs.update_queue(queue)
        return json_response(queue_json(queue))

    async def delete_queue(self, request: web.Request) -> web.Response:
        queue = await self.queue(request, "admin")
        contents_only = request.query.get("contents_only", "false").lower() in ("1", "true", "yes")
        if self.r.outputs is not None:
            # emptied: groups reload from the new ack levels (their streams reconnect);
            # deleted: their streams are closed for good
            code = MOVED_CLOSE if contents_only else DELETED_CLOSE
            await self.r.outputs.unload(queue.name, close_code=code)
        await self.r.controller.delete_queue(queue.name, contents_only=contents_only)
        return web.Response(status=204)

    # groups
    async def put_group(self, request: web.Request) -> web.Response:
        queue = await self.queue(request, "admin")
        name = check_name("group", request.match_info["group"])
        config = await decode(request, GroupConfig)
        group, created = await self.r.controller.create_group(queue.name, name, config)
        if self.r.outputs is not None:
            await self.r.outputs.load(queue.name, name)
        return json_response(group_json(group), 201 if created else 200)

    async def list_groups(self, request: web.Request) -> web.Response:
        queue = await self.queue(request, None)
        groups = await self.r.metadata.list_groups(queue.name)
        return json_response({"groups": [group_json(g) for g in groups]})

    async def get_group(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, None)
        stats = await self.routing.stats(
            request, group, lambda: self._group_stats(group), lambda: self._group_stats(group, True)
        )
        served = await self.r.outputs.load(group.queue, group.name) if self.r.outputs else None
        body = {**group_json(served or group), "stats": stats}
        if group.config.type == STREAM:
            body["lag"] = (await stream_lag(self.r.metadata, self.r.stores, group)).json()
        return json_response(body)

    async def _group_stats(self, group: Group, persisted: bool = False) -> s.GroupStats:
        """The stats of the extents this process serves; with none, nothing, or with
        ``persisted`` the group's backlog by its persisted ack levels."""
        ranges = await self.r.controller.dlq_ranges(group.dlq)
        dlq_depth = sum(max(0, last - level.acked) for _, level, last in ranges)
        state = await self._state(group)
        if state is None:
            return await self._persisted_stats(group, dlq_depth, persisted)
        return s.GroupStats(
            backlog=state.backlog,
            in_flight=state.in_flight,
            dlq_depth=dlq_depth,
            oldest_unacked_age_seconds=state.oldest_unacked_age_seconds,
            delivered=state.delivered,
            acked=state.acked,
            redelivered=state.redelivered,
        )

    async def _persisted_stats(self, group: Group, dlq_depth: int, read: bool) -> s.GroupStats:
        rows = await self.r.metadata.get_ack_levels(group.queue, group.name) if read else []
        levels = {a.extent: a.acked for a in rows}
        backlog = 0
        extents = await self.r.metadata.list_extents(group.queue, (OPEN, FAILING, SEALED))
        for extent in extents if read else []:
            info = await self.r.stores.info(extent)
            backlog += max(0, info.count - levels.get(extent.id, 0))
        return s.GroupStats(
            backlog=backlog, in_flight=0, dlq_depth=dlq_depth, oldest_unacked_age_seconds=0.0,
            delivered=0, acked=0, redelivered=0,
        )  # fmt: skip

    async def patch_group(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, "admin")
        patch = await decode(request, GroupPatch)
        group.config = msgspec.structs.replace(
            group.config,
            **{k: v for k, v in msgspec.structs.asdict(patch).items() if v is not None},
        )
        await self.r.metadata.update_group(group)
        if self.r.outputs is not None:
            self.r.outputs.update_group(group)
        return json_response(group_json(group))

    async def delete_group(self, request: web.Request) -> web.Response:
        queue = await self.queue(request, "admin")
        name = check_name("group", request.match_info["group"])
        await self.r.metadata.get_group(queue.name, name)
        if self.r.outputs is not None:
            await self.r.outputs.unload(queue.name, name)
        await self.r.controller.delete_group(queue.name, name)
        return web.Response(status=204)

    # publish
    async def publish(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        queue = await self.queue(request, "produce")
        body = await decode(request, s.PublishRequest, empty_ok=False)
        messages = to_messages(queue, body.messages)
        inputs = await self.input_host(queue)
        key = self.r.keys.find(request.headers.get("Authorization"))
        size = sum(len(m.body) for m in messages)
        await self.throttle.admit(queue, key, len(messages), size, fresh=True)
        ids = await inputs.publish(queue, messages)
        self.r.metrics.published(queue.name, len(ids), time.perf_counter() - started)
        return json_response(s.PublishResponse(ids))

    # receive and settle (consumerrouting.py spreads them over a cluster's output hosts)
    async def receive(self, request: web.Request) -> web.Response:
        group = check_competing(await self.group_record(request, "consume"))
        body = await decode(request, s.ReceiveRequest)

        def waiting(wait: float) -> s.ReceiveRequest:
            return msgspec.structs.replace(body, wait_seconds=wait)

        routed = await self.routing.receive(
            request, group, body.wait_seconds,
            lambda wait: self._receive_here(group, waiting(wait)), waiting,
        )  # fmt: skip
        return routed or await self._receive_here(group, body)

    async def _receive_here(self, group: Group, body: s.ReceiveRequest) -> web.Response:
        if self.r.outputs is None:  # a direct receive to a host that serves no group
            return json_response({"messages": []})
        taken = await self.r.outputs.receive(
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
    ) -> tuple[int, list[str]]:
        """Settle by receipt: here, or at the output host each receipt names. With
        ``durable``, answered once what was applied is persisted."""

        async def local(part: list[str]) -> tuple[int, list[str]]:
            if self.r.outputs is None:
                return 0, part
            return await self.r.outputs.settle(group, part, how, durable)

        return await self.routing.settle(request, receipts, local, body_for)

    async def ack(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, "consume")
        body = await decode(request, s.AckRequest, empty_ok=False)
        n, stale = await self._settle(
            request, group, body.receipts, Settlement("ack"),
            lambda part: s.AckRequest(receipts=part),
        )  # fmt: skip
        return json_response(s.AckResponse(n, stale))

    async def nack(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, "consume")
        body = await decode(request, s.NackRequest, empty_ok=False)
        # answered once the messages are parked durably (their rows are written)
        n, stale = await self._settle(
            request, group, body.receipts,
            Settlement("nack", body.delay_seconds),
            lambda part: s.NackRequest(receipts=part, delay_seconds=body.delay_seconds),
        )  # fmt: skip
        return json_response(s.NackResponse(n, stale))

    async def visibility(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, "consume")
        body = await decode(request, s.VisibilityRequest, empty_ok=False)
        seconds = body.visibility_timeout_seconds
        n, stale = await self._settle(
            request, group, body.receipts,
            Settlement("extend", seconds),
            lambda part: s.VisibilityRequest(receipts=part, visibility_timeout_seconds=seconds),
            durable=False,
        )  # fmt: skip
        return json_response(s.VisibilityResponse(n, stale))

    # dead-letter queue
    async def group_record(self, request: web.Request, scope: Scope | None) -> Group:
        queue = await self.queue(request, scope)
        return await self.r.metadata.get_group(
            queue.name, check_name("group", request.match_info["group"])
        )

    async def dlq_browse(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, "consume")
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            raise InvalidRequest("limit must be an integer") from None
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be from 1 to 1000")
        messages: list[dict[str, Any]] = []
        depth = 0
        for extent, level, last_seq in await self.r.controller.dlq_ranges(group.dlq):
            depth += max(0, last_seq - level.acked)
            if len(messages) >= limit or last_seq <= level.acked:
                continue
            batch = await self.r.stores.read(extent, level.level, limit - len(messages))
            for raw in batch.records:
                record = decode_record(raw)
                messages.append({
                    "id": record.orig_id or "",
                    **body_fields(record.body, record.text),
                    "attributes": record.attributes or {},
                    "enqueued_at": rfc3339(record.enqueued_ms),
                })  # fmt: skip
        return json_response({"messages": messages, "depth": depth})

    async def dlq_merge(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, "admin")
        merged = await self.r.controller.move_dlq_cursor(group.dlq, group)
        return json_response({"merged": merged})

    async def dlq_purge(self, request: web.Request) -> web.Response:
        group = await self.group_record(request, "admin")
        purged = await self.r.controller.move_dlq_cursor(group.dlq, None)
        return json_response({"purged": purged})


def build_app(roles: Roles) -> web.Application:
    from cherami.roles.frontend.console import add_console_routes
    from cherami.roles.frontend.extents import add_stream_group_routes
    from cherami.roles.frontend.routing import add_routing_routes
    from cherami.roles.frontend.streams import StreamHandlers
    from cherami.roles.frontend.swagger import add_docs_routes

    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[errors_middleware])
    app[ROUTER] = roles.router
    f = Frontend(roles)
    streams = StreamHandlers(f)
    app[STREAMS] = streams
    roles.metrics.connections = streams.count
    app.on_shutdown.append(streams.close_all)
    q = "/v1/queues/{queue}"
    g = q + "/groups/{group}"
    app.add_routes([
        web.get("/healthz", f.healthz),
        web.get("/metrics", f.metrics),
        web.get("/openapi.json", f.openapi),
        web.get("/v1/cluster", f.cluster),
        web.get("/v1/queues", f.list_queues),
        web.put(q, f.put_queue),
        web.get(q, f.get_queue),
        web.patch(q, f.patch_queue),
        web.delete(q, f.delete_queue),
        web.post(q + "/messages", f.publish),
        web.get(q + "/publish", streams.publish),
        web.get(q + "/groups", f.list_groups),
        web.put(g, f.put_group),
        web.get(g, f.get_group),
        web.patch(g, f.patch_group),
        web.delete(g, f.delete_group),
        web.post(g + "/receive", f.receive),
        web.post(g + "/ack", f.ack),
        web.post(g + "/nack", f.nack),
        web.post(g + "/visibility", f.visibility),
        web.get(g + "/consume", streams.consume),
        web.get(g + "/consumers", f.routing.consumers),
        web.get(g + "/dlq", f.dlq_browse),
        web.post(g + "/dlq/merge", f.dlq_merge),
        web.post(g + "/dlq/purge", f.dlq_purge),
    ])  # fmt: skip
    add_stream_group_routes(app, f)
    add_routing_routes(app, f)
    add_console_routes(app)
    add_docs_routes(app)
    return app
