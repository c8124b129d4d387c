"""The OpenAPI document of the HTTP API, built from the msgspec types that validate it."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from cherami.metadata.models import GroupConfig, GroupPatch, QueueConfig, QueuePatch
from cherami.roles.frontend import schemas as s

_ERRORS = {
    "400": "invalid_name or invalid_request",
    "401": "unauthorized",
    "403": "forbidden",
    "404": "queue_not_found or group_not_found",
    "409": "already_exists",
    "413": "message_too_large",
    "429": "throttled",
    "503": "unavailable",
}

Q = "/v1/queues/{queue}"
G = Q + "/groups/{group}"

# path, method, summary, request type, response type
_OPERATIONS: list[tuple[str, str, str, type | None, type | None]] = [
    ("/v1/queues", "get", "List queues", None, None),
    (Q, "put", "Create a queue (201; 200 if the same exists; 409 if different)", QueueConfig, None),
    (Q, "get", "Show a queue with stats", None, s.QueueStats),
    (Q, "patch", "Change retention, delay, min_extents", QueuePatch, None),
    (Q, "delete", "Delete a queue (?contents_only=true keeps queue and groups)", None, None),
    (
        Q + "/messages",
        "post",
        "Publish 1 to 1000 messages durably",
        s.PublishRequest,
        s.PublishResponse,
    ),
    (Q + "/publish", "get", "WebSocket: streaming publish (docs/protocol.md)", None, None),
    (Q + "/publishers", "get", "The input hosts to publish a stream to (routing)", None, None),
    (Q + "/groups", "get", "List consumer groups", None, None),
    (G, "put", "Create a consumer group and its DLQ", GroupConfig, None),
    (G, "get", "Show a group with stats", None, s.GroupStats),
    (G, "patch", "Change a group", GroupPatch, None),
    (G, "delete", "Delete a group and its DLQ", None, None),
    (
        G + "/receive",
        "post",
        "Receive with a visibility timeout (long poll)",
        s.ReceiveRequest,
        s.ReceiveResponse,
    ),
    (G + "/ack", "post", "Ack by receipts", s.AckRequest, s.AckResponse),
    (
        G + "/nack",
        "post",
        "Nack by receipts, visible again after a delay",
        s.NackRequest,
        s.NackResponse,
    ),
    (
        G + "/visibility",
        "post",
        "Extend visibility timeouts",
        s.VisibilityRequest,
        s.VisibilityResponse,
    ),
    (G + "/consume", "get", "WebSocket: streaming consume (docs/protocol.md)", None, None),
    (G + "/consumers", "get", "The output hosts to consume a stream from (routing)", None, None),
    (G + "/dlq", "get", "Browse the group's DLQ", None, s.DlqResponse),
    (G + "/dlq/merge", "post", "Deliver the DLQ's messages again to this group only", None, None),
    (G + "/dlq/purge", "post", "Delete the DLQ's messages", None, None),
    (Q + "/extents", "get", "List extents with replicas (stream-mode readers)", None, None),
    (G + "/offsets", "get", "A stream-mode group's offsets {extent: next_seq}", None, None),
    (G + "/offsets", "post", "Move a stream-mode group's offsets forward", s.OffsetsBody, None),
]


@functools.cache
def openapi_document() -> dict[str, Any]:
    types = {t for _, _, _, a, b in _OPERATIONS for t in (a, b) if t is not None}
    ordered = sorted(types, key=lambda t: t.__name__)
    refs, components = msgspec.json.schema_components(
        ordered, ref_template="#/components/schemas/{name}"
    )
    ref = dict(zip(ordered, refs, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for path, method, summary, req, resp in _OPERATIONS:
        op: dict[str, Any] = {"summary": summary, "responses": {}}
        params = [n for n in ("queue", "group") if "{" + n + "}" in path]
        if params:
            op["parameters"] = [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                for n in params
            ]
        if req is not None:
            op["requestBody"] = {"content": {"application/json": {"schema": ref[req]}}}
        ok: dict[str, Any] = {"description": "success"}
        if resp is not None:
            ok["content"] = {"application/json": {"schema": ref[resp]}}
        op["responses"]["200"] = ok
        for status, codes in _ERRORS.items():
            op["responses"][status] = {"description": codes}
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Cherami HTTP API", "version": "1"},
        "paths": {
            "/openapi.json": {
                "get": {"summary": "This document", "responses": {"200": {"description": "ok"}}}
            },
            "/healthz": {
                "get": {"summary": "200 once ready", "responses": {"200": {"description": "ok"}}}
            },
            "/metrics": {
                "get": {"summary": "Prometheus text", "responses": {"200": {"description": "ok"}}}
            },
            **paths,
        },
        "components": {"schemas": components},
    }
