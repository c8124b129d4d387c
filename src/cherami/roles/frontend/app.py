"""The frontend: the public HTTP API of docs/api.md over the other roles. This module is
its plumbing: the error middleware, the app factory and the routes table; the handlers
are in handlers/ (a module per resource) and streams.py, each given what it uses."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from aiohttp import web

from cherami.errors import CheramiError, MessageTooLarge, Unavailable
from cherami.httpbase import (
    BODY_TIMED_OUT,
    MAX_REQUEST_BYTES,
    Handler,
    RouteNotFound,
    after_upgrade,
    body_deadline,
    caller_gone,
    error_response,
    internal_error,
    json_response,
)
from cherami.roles.frontend.console import add_console_routes
from cherami.roles.frontend.consumerrouting import ConsumerRouting
from cherami.roles.frontend.context import Frontend, Roles
from cherami.roles.frontend.extents import add_stream_group_routes
from cherami.roles.frontend.handlers.dlq import DlqHandlers
from cherami.roles.frontend.handlers.grants import GrantHandlers
from cherami.roles.frontend.handlers.groups import GroupHandlers
from cherami.roles.frontend.handlers.messages import MessageHandlers
from cherami.roles.frontend.handlers.ops import OpsHandlers
from cherami.roles.frontend.handlers.peek import PeekHandlers
from cherami.roles.frontend.handlers.queues import QueueHandlers
from cherami.roles.frontend.handlers.scheduled import ScheduledHandlers
from cherami.roles.frontend.proxy import Forward, Router, forward
from cherami.roles.frontend.routing import add_routing_routes
from cherami.roles.frontend.streams import StreamHandlers
from cherami.roles.frontend.swagger import add_docs_routes
from cherami.roles.frontend.throttle import Throttle

__all__ = ["ROUTER", "STREAMS", "Roles", "build_app", "errors_middleware"]

log = logging.getLogger("cherami.frontend.app")

ROUTER: web.AppKey[Router | None] = web.AppKey("router")
STREAMS: web.AppKey[Any] = web.AppKey("streams")  # its StreamHandlers (open streams)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as its documented answer; after a WebSocket upgrade, as a close (1011)."""
    return await after_upgrade(request, await _answered(request, handler))


async def _answered(request: web.Request, handler: Handler) -> web.StreamResponse:
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
            return error_response(RouteNotFound())
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
        if not caller_gone(request):
            log.exception("unhandled error on %s %s", request.method, request.path)
            return internal_error()
        # the client went away mid-request: its doing, worth one line, not a traceback
        # (a body that came too slowly was logged as that when its connection was closed)
        if not request.get(BODY_TIMED_OUT):
            log.info("%s %s: the client went away (%s)", request.method, request.path, err)
        return json_response(
            {"error": {"code": "invalid_request", "message": "connection lost mid-request"}}, 400
        )
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return internal_error()


def build_app(roles: Roles) -> web.Application:
    app = web.Application(
        client_max_size=MAX_REQUEST_BYTES, middlewares=[body_deadline, errors_middleware]
    )
    app[ROUTER] = roles.router
    f = Frontend(roles)
    throttle = Throttle(
        roles.metadata, roles.stores, roles.inputs.host_id if roles.inputs else None,
        roles.metrics.refused,
    )  # fmt: skip
    roles.controller.deleted.extend((throttle.forget, roles.metrics.forget))
    routing = ConsumerRouting(f)
    ops = OpsHandlers(f, roles.metadata, roles.ready, partial(roles.metrics.scrape, f))
    queues = QueueHandlers(
        f, roles.metadata, roles.controller, roles.stores, roles.outputs, throttle
    )
    groups = GroupHandlers(
        f, roles.metadata, roles.controller, roles.stores, roles.outputs, routing
    )
    messages = MessageHandlers(f, roles.keys, throttle, roles.metrics, roles.outputs, routing)
    dlq = DlqHandlers(f, roles.controller, roles.stores)
    peek = PeekHandlers(f, roles.metadata, roles.stores)
    read_grants = GrantHandlers(f, roles.metadata, roles.stores)
    scheduled = ScheduledHandlers(f, roles.metadata, roles.stores)
    streams = StreamHandlers(f, roles.metadata, roles.keys, throttle, roles.metrics, roles.outputs)
    app[STREAMS] = streams
    roles.metrics.connections = streams.count
    app.on_shutdown.append(streams.close_all)
    q = "/v1/queues/{queue}"
    g = q + "/groups/{group}"
    app.add_routes([
        web.get("/healthz", ops.healthz),
        web.get("/metrics", ops.metrics),
        web.get("/openapi.json", ops.openapi),
        web.get("/v1/cluster", ops.cluster),
        web.get("/v1/queues", queues.list_queues),
        web.put(q, queues.put_queue),
        web.get(q, queues.get_queue),
        web.patch(q, queues.patch_queue),
        web.delete(q, queues.delete_queue),
        web.post(q + "/messages", messages.publish),
        web.get(q + "/messages", peek.peek),
        web.post(q + "/read-grants", read_grants.read_grants),
        web.get(q + "/scheduled", scheduled.list_scheduled),
        web.delete(q + "/scheduled/{id}", scheduled.cancel_scheduled),
        web.get(q + "/publish", streams.publish),
        web.get(q + "/groups", groups.list_groups),
        web.put(g, groups.put_group),
        web.get(g, groups.get_group),
        web.patch(g, groups.patch_group),
        web.delete(g, groups.delete_group),
        web.post(g + "/receive", messages.receive),
        web.post(g + "/ack", messages.ack),
        web.post(g + "/nack", messages.nack),
        web.post(g + "/visibility", messages.visibility),
        web.get(g + "/consume", streams.consume),
        web.get(g + "/consumers", routing.consumers),
        web.get(g + "/dlq", dlq.dlq_browse),
        web.post(g + "/dlq/merge", dlq.dlq_merge),
        web.post(g + "/dlq/purge", dlq.dlq_purge),
    ])  # fmt: skip
    add_stream_group_routes(app, f)
    add_routing_routes(app, f)
    add_console_routes(app)
    add_docs_routes(app)
    return app
