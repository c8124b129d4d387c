"""SQS's two wire protocols on one port, read into one shape and written back:

- JSON (``X-Amz-Target: AmazonSQS.<Action>``, ``application/x-amz-json-1.0``), what
  current SDKs send: the body is the action's input; errors carry ``__type`` and the
  ``x-amzn-query-error`` header (the query protocol's code), which SDKs use to raise the
  modelled exception;
- query (``Action=<Action>`` form-encoded, or in the URL), what SDKs sent before, with
  flattened names (``Attribute.1.Name``, ``MessageAttribute.1.Value.StringValue``,
  ``SendMessageBatchRequestEntry.1.Id``); answers are XML. The names a current SDK
  derives from the JSON model (``Attributes.1.key``, ``Entries.1.Id``) are read too.

Either way an action gets its input as the JSON protocol's dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

import msgspec
from aiohttp import web

from cherami.roles.frontend.sqs.errors import SqsError, invalid

JSON_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"
_json = msgspec.json.Encoder()

# query names, legacy and current, of the inputs that are not plain values
_MAPS = {
    "Attribute": "Attributes", "Attributes": "Attributes",
    "MessageAttribute": "MessageAttributes", "MessageAttributes": "MessageAttributes",
    "MessageSystemAttribute": "MessageSystemAttributes",
    "MessageSystemAttributes": "MessageSystemAttributes",
    "Tag": "Tags", "Tags": "Tags", "tags": "Tags",
}  # fmt: skip
_LISTS = {
    "AttributeName": "AttributeNames", "AttributeNames": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageAttributeNames": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "MessageSystemAttributeNames": "MessageSystemAttributeNames",
    "TagKey": "TagKeys", "TagKeys": "TagKeys",
}  # fmt: skip
_KEY_NAMES = ("Name", "Key", "key")
_VALUE_NAMES = ("Value", "value")


@dataclass
class SqsRequest:
    action: str
    params: dict[str, Any]
    query: bool  # the query protocol (XML answers)
    request_id: str


def parse(request: web.Request, body: bytes, request_id: str) -> SqsRequest:
    target = request.headers.get("X-Amz-Target", "")
    if target:
        if not target.startswith(TARGET_PREFIX):
            raise SqsError("UnknownOperationException", f"unknown target {target}")
        try:
            params = msgspec.json.decode(body) if body.strip() else {}
        except msgspec.DecodeError:
            raise SqsError("SerializationException", "the body is not valid JSON") from None
        if not isinstance(params, dict):
            raise SqsError("SerializationException", "the body must be a JSON object")
        return SqsRequest(target[len(TARGET_PREFIX) :], params, False, request_id)
    form: list[tuple[str, str]] = list(request.query.items())
    content_type = request.headers.get("Content-Type", "")
    if body and "x-www-form-urlencoded" in content_type:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid("the form body is not UTF-8") from None
        form += parse_qsl(text, keep_blank_values=True)
    flat = dict(form)
    action = flat.pop("Action", "")
    if not action:
        raise SqsError("MissingAction", "no action: give X-Amz-Target or Action")
    params = form_params(flat)
    if "QueueUrl" not in params and request.path.count("/") >= 2:
        params["QueueUrl"] = str(request.url.with_query(None))  # posted to the queue's URL
    return SqsRequest(action, params, True, request_id)


def form_params(flat: dict[str, str]) -> dict[str, Any]:
    """A query request's parameters as the JSON protocol's input."""
    return _normalize(_tree(flat))


def _tree(flat: dict[str, str]) -> dict[str, Any]:
    """``a.1.b=v`` as ``{"a": {"1": {"b": "v"}}}``."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = root
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise invalid(f"parameter {key} conflicts with another")
            node = child
        node[parts[-1]] = value
    return root


def _ordered(node: Any, name: str) -> list[Any]:
    if not isinstance(node, dict):
        raise invalid(f"{name} must be numbered: {name}.1, {name}.2, ...")
    try:
        return [node[k] for k in sorted(node, key=int)]
    except ValueError:
        raise invalid(f"{name} must be numbered: {name}.1, {name}.2, ...") from None


def _normalize(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if value == "" and (
            key in _MAPS or key in _LISTS or key.endswith(("RequestEntry", "Entries"))
        ):
            value = {}  # an empty list or map: ``Entries=``
        if key in _MAPS:
            out[_MAPS[key]] = _map(value, key)
        elif key in _LISTS:
            out[_LISTS[key]] = _ordered(value, key)
        elif key.endswith("RequestEntry") or key == "Entries":
            out["Entries"] = [
                _normalize(e) if isinstance(e, dict) else e for e in _ordered(value, key)
            ]
        elif isinstance(value, dict):
            out[key] = _normalize(value)
        else:
            out[key] = value
    return out


def _map(node: Any, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in _ordered(node, name):
        if not isinstance(entry, dict):
            raise invalid(f"{name} entries need a name and a value")
        key = next((entry[k] for k in _KEY_NAMES if k in entry), None)
        value = next((entry[k] for k in _VALUE_NAMES if k in entry), None)
        if not isinstance(key, str) or value is None:
            raise invalid(f"{name} entries need a name and a value")
        out[key] = _normalize(value) if isinstance(value, dict) else value
    return out


# answers
def answer(req: SqsRequest, result: dict[str, Any]) -> web.Response:
    if not req.query:
        return web.Response(
            body=_json.encode(result), content_type=JSON_TYPE,
            headers={"x-amzn-RequestId": req.request_id},
        )  # fmt: skip
    inner = "".join(_xml(key, value, req.action) for key, value in result.items())
    text = (
        f'<?xml version="1.0"?><{req.action}Response xmlns="{XMLNS}">'
        f"<{req.action}Result>{inner}</{req.action}Result>"
        f"<ResponseMetadata><RequestId>{req.request_id}</RequestId></ResponseMetadata>"
        f"</{req.action}Response>"
    )
    return web.Response(text=text, content_type="text/xml")


def error_answer(err: SqsError, query: bool, request_id: str) -> web.Response:
    if not query:
        return web.Response(
            body=_json.encode({"__type": "com.amazonaws.sqs#" + err.name, "message": err.message}),
            status=err.status, content_type=JSON_TYPE,
            headers={"x-amzn-query-error": f"{err.code};{err.fault}",
                     "x-amzn-RequestId": request_id},
        )  # fmt: skip
    text = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XMLNS}"><Error><Type>{err.fault}</Type>'
        f"<Code>{escape(err.code)}</Code><Message>{escape(err.message)}</Message><Detail/>"
        f"</Error><RequestId>{request_id}</RequestId></ErrorResponse>"
    )
    return web.Response(text=text, status=err.status, content_type="text/xml")


# the legacy names of repeated elements in the query protocol's answers
_XML_LISTS = {
    "QueueUrls": "QueueUrl", "queueUrls": "QueueUrl", "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
}  # fmt: skip
_XML_MAPS = {
    "Attributes": ("Attribute", "Name", "Value"),
    "MessageAttributes": ("MessageAttribute", "Name", "Value"),
    "Tags": ("Tag", "Key", "Value"),
}


def _xml(key: str, value: Any, action: str) -> str:
    if value is None:
        return ""
    if key in _XML_MAPS and isinstance(value, dict):
        element, k, v = _XML_MAPS[key]
        return "".join(
            f"<{element}><{k}>{escape(name)}</{k}>{_xml(v, item, action)}</{element}>"
            for name, item in value.items()
        )
    if isinstance(value, list):
        # Successful, Results: <Action>ResultEntry
        element = _XML_LISTS.get(key) or f"{action}ResultEntry"
        return "".join(_xml(element, item, action) for item in value)
    if isinstance(value, dict):
        inner = "".join(_xml(k, v, action) for k, v in value.items())
        return f"<{key}>{inner}</{key}>"
    if isinstance(value, bool):
        return f"<{key}>{'true' if value else 'false'}</{key}>"
    return f"<{key}>{escape(str(value))}</{key}>"
