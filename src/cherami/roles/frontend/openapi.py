"""The OpenAPI document of the HTTP API, built from the msgspec types that validate it."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from cherami.metadata.models import (
    NAME_PATTERN,
    GroupConfig,
    GroupPatch,
    QueueConfig,
    QueuePatch,
)
from cherami.roles.frontend import schemas as s
from cherami.roles.frontend.convert import MS_PATTERN
from cherami.roles.frontend.handlers import peek, scheduled
from cherami.roles.frontend.paging import (
    CURSOR_PATTERN,
    DEFAULT_LIMIT,
    MAX_CURSOR,
    MAX_LIMIT,
    PREFIX_PATTERN,
)

# every error an operation can answer, by status (docs/api.md "Errors")
_ERROR_TEXT = {
    "400": "invalid_name or invalid_request",
    "401": "unauthorized: an API key is required",
    "403": "forbidden: the key lacks the scope or does not cover the queue",
    "404": "queue_not_found, group_not_found or message_not_found",
    "409": "already_exists (with a different config), or already_due",
    "413": "message_too_large",
    "429": "throttled, backlog_full or storage_full: send again after Retry-After",
    "503": "unavailable: retry",
}
_ANY = ("400", "401", "403", "503")  # a name, a key, a scope, a host: any named call
_NAMED = (*_ANY, "404")

Q = "/v1/queues/{queue}"
G = Q + "/groups/{group}"
B64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
NAME = {"type": "string", "pattern": NAME_PATTERN, "maxLength": 128}
# a listing's page (docs/api.md "List"; paging.py)
PAGE = (
    {"name": "limit", "in": "query", "description": f"at most this many (default {DEFAULT_LIMIT})",
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
    {"name": "cursor", "in": "query", "description": "the cursor of the page before (opaque)",
     "schema": {"type": "string", "pattern": CURSOR_PATTERN, "maxLength": MAX_CURSOR}},
    {"name": "prefix", "in": "query", "description": "only names that start with it",
     "schema": {"type": "string", "pattern": PREFIX_PATTERN, "maxLength": 128}},
)  # fmt: skip

# a peek's page (docs/api.md "Peek"; handlers/peek.py)
TIME = {"anyOf": [{"type": "string", "pattern": MS_PATTERN},
                  {"type": "string", "format": "date-time"}]}  # fmt: skip
PEEK = (
    PAGE[0],
    {"name": "cursor", "in": "query", "description": "the cursor of the page before (opaque)",
     "schema": {"type": "string", "pattern": peek.CURSOR_PATTERN}},
    {"name": "order", "in": "query", "description": "asc (oldest first, default) or desc",
     "schema": {"type": "string", "enum": ["asc", "desc"]}},
    {"name": "since", "in": "query", "description": "enqueued at or after (RFC 3339 or ms)",
     "schema": TIME},
    {"name": "until", "in": "query", "description": "enqueued before (RFC 3339 or ms)",
     "schema": TIME},
)  # fmt: skip

# a page of scheduled messages (docs/api.md "Scheduled messages"; handlers/scheduled.py)
SCHEDULED = (
    PAGE[0],
    {"name": "cursor", "in": "query", "description": "the cursor of the page before (opaque)",
     "schema": {"type": "string", "pattern": scheduled.CURSOR_PATTERN}},
    {"name": "until", "in": "query", "description": "due before (RFC 3339 or ms)",
     "schema": TIME},
)  # fmt: skip
# a message's id (extent:seq)
MESSAGE_ID = {"type": "string", "pattern": r"^[A-Za-z0-9-]{1,64}:[0-9]{1,19}$"}


class Op(msgspec.Struct, frozen=True):
    path: str
    method: str
    id: str
    summary: str
    request: type | None = None
    response: type | None = None
    ok: tuple[str, ...] = ("200",)
    errors: tuple[str, ...] = _NAMED
    wrap: str | None = None  # the response is the queue's or group's record plus this key
    query: tuple[dict[str, Any], ...] = ()  # its query parameters


_OPERATIONS: list[Op] = [
    Op("/v1/queues", "get", "listQueues", "List queues by name, a page at a time", None,
       s.QueuePage, errors=("400", "401", "503"), query=PAGE),
    Op(Q, "put", "createQueue", "Create a queue (201; 200 if the same exists; 409 if different)",
       QueueConfig, ok=("200", "201"), errors=(*_ANY, "409")),
    Op(Q, "get", "getQueue", "Show a queue: its config and stats", None, s.QueueStats,
       wrap="stats"),
    Op(Q, "patch", "updateQueue", "Change a queue's config", QueuePatch),
    Op(Q, "delete", "deleteQueue", "Delete a queue (?contents_only=true keeps queue and groups)",
       ok=("204",)),
    Op(Q + "/messages", "post", "publish", "Publish 1 to 1000 messages durably",
       s.PublishRequest, s.PublishResponse, errors=(*_NAMED, "413", "429")),
    Op(Q + "/messages", "get", "peek", "Read retained messages without consuming them",
       None, peek.PeekResponse, query=PEEK),
    Op(Q + "/scheduled", "get", "listScheduled",
       "List delayed messages not due yet, in due order", None, scheduled.ScheduledResponse,
       query=SCHEDULED),
    Op(Q + "/scheduled/{id}", "delete", "cancelScheduled",
       "Cancel a delayed message before it is due", ok=("204",), errors=(*_NAMED, "409")),
    Op(Q + "/publishers", "get", "publishers", "The input hosts to publish a stream to"),
    Op(Q + "/groups", "get", "listGroups", "List consumer groups by name, a page at a time",
       None, s.GroupPage, query=PAGE),
    Op(G, "put", "createGroup", "Create a consumer group and its DLQ", GroupConfig,
       ok=("200", "201"), errors=(*_NAMED, "409")),
    Op(G, "get", "getGroup", "Show a group: its config and stats", None, s.GroupStats,
       wrap="stats"),
    Op(G, "patch", "updateGroup", "Change a group", GroupPatch),
    Op(G, "delete", "deleteGroup", "Delete a group and its DLQ", ok=("204",)),
    Op(G + "/receive", "post", "receive", "Receive with a visibility timeout (long poll)",
       s.ReceiveRequest, s.ReceiveResponse),
    Op(G + "/ack", "post", "ack", "Ack by receipts", s.AckRequest, s.AckResponse),
    Op(G + "/nack", "post", "nack", "Nack by receipts, visible again after a delay",
       s.NackRequest, s.NackResponse),
    Op(G + "/visibility", "post", "changeVisibility", "Extend visibility timeouts",
       s.VisibilityRequest, s.VisibilityResponse),
    Op(G + "/consumers", "get", "consumers", "The output hosts to consume a stream from"),
    Op(G + "/dlq", "get", "browseDlq", "Browse the group's DLQ", None, s.DlqResponse),
    Op(G + "/dlq/merge", "post", "mergeDlq", "Deliver the DLQ's messages again to this group"),
    Op(G + "/dlq/purge", "post", "purgeDlq", "Delete the DLQ's messages"),
    Op(Q + "/extents", "get", "listExtents", "List extents with replicas (stream-mode readers)"),
    Op(Q + "/read-grants", "post", "readGrants", "Grants to read extents from the store "
       "hosts without the cluster secret (stream-mode readers)", s.ReadGrantsBody,
       s.ReadGrantsResponse),
    Op(G + "/offsets", "get", "getOffsets", "A stream-mode group's offsets {extent: next_seq}"),
    Op(G + "/offsets", "post", "commitOffsets", "Move a stream-mode group's offsets forward",
       s.OffsetsBody),
]  # fmt: skip


# the requests refused without a body (the others take an empty body as {})
_BODY_REQUIRED = {s.PublishRequest, s.AckRequest, s.NackRequest, s.VisibilityRequest, s.OffsetsBody}

# WebSocket endpoints (OpenAPI describes no WebSocket): listed beside the paths
_WEBSOCKETS = [
    {"path": Q + "/publish", "summary": "streaming publish (docs/protocol.md §3)"},
    {"path": G + "/consume", "summary": "streaming consume (docs/protocol.md §4)"},
]


@functools.cache
def openapi_document() -> dict[str, Any]:
    types = {t for op in _OPERATIONS for t in (op.request, op.response) if t is not None}
    ordered = sorted(types, key=lambda t: t.__name__)
    refs, components = msgspec.json.schema_components(
        ordered, ref_template="#/components/schemas/{name}"
    )
    ref = dict(zip(ordered, refs, strict=True))
    # what the types cannot say: a message has exactly one of body and body_b64, and
    # body_b64 is padded base64
    # a group's start_from: earliest, latest, or an RFC 3339 time
    start = {"anyOf": [{"enum": ["earliest", "latest"]}, {"type": "string", "format": "date-time"}]}
    components["GroupConfig"]["properties"]["start_from"] = start
    message = components["PublishMessage"]
    text, b64, null = {"type": "string"}, {"type": "string", "pattern": B64}, {"type": "null"}
    message["properties"]["body_b64"] = {"anyOf": [b64, null]}
    # a TTL: at most one of expires_in_seconds and expires_at, a time as a peek takes it
    message["properties"]["expires_at"] = {**TIME, "maxLength": 64}
    message["not"] = {"required": ["expires_in_seconds", "expires_at"]}
    message["oneOf"] = [
        {"required": ["body"], "properties": {"body": text, "body_b64": null}},
        {"required": ["body_b64"], "properties": {"body_b64": b64, "body": null}},
    ]
    paths: dict[str, dict[str, Any]] = {}
    for op in _OPERATIONS:
        spec: dict[str, Any] = {"operationId": op.id, "summary": op.summary, "responses": {}}
        params = [n for n in ("queue", "group", "id") if "{" + n + "}" in op.path]
        parameters = [
            {"name": n, "in": "path", "required": True,
             "schema": MESSAGE_ID if n == "id" else NAME}
            for n in params
        ] + list(op.query)  # fmt: skip
        if parameters:
            spec["parameters"] = parameters
        if op.request is not None:
            spec["requestBody"] = {
                "required": op.request in _BODY_REQUIRED,
                "content": {"application/json": {"schema": ref[op.request]}},
            }
        for status in op.ok:
            ok: dict[str, Any] = {"description": "success"}
            if op.response is not None and status == "200":
                schema = ref[op.response]
                if op.wrap is not None:  # the record's fields and the stats beside them
                    schema = {"type": "object", "required": [op.wrap],
                              "properties": {op.wrap: schema}}  # fmt: skip
                ok["content"] = {"application/json": {"schema": schema}}
            spec["responses"][status] = ok
        for status in op.errors:
            spec["responses"][status] = {"description": _ERROR_TEXT[status]}
        paths.setdefault(op.path, {})[op.method] = spec
    plain = {"security": [], "responses": {"200": {"description": "ok"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Cherami HTTP API", "version": "1"},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # a key when the server has keys (docs/api.md "Auth"); none when it has none
        "security": [{"bearer": []}, {}],
        "x-websockets": _WEBSOCKETS,
        "paths": {
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document",
                                      **plain}},
            "/healthz": {"get": {"operationId": "health", "summary": "200 once ready; 503 "
                                 "while starting", **plain,
                                 "responses": {"200": {"description": "ok or degraded"},
                                               "503": {"description": "starting"}}}},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus text",
                                 "security": [{"bearer": []}, {}],
                                 "responses": {"200": {"description": "ok"},
                                               "401": {"description": _ERROR_TEXT["401"]}}}},
            **paths,
        },
    }  # fmt: skip
