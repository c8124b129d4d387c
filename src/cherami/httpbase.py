"""HTTP plumbing shared by the processes' listeners (a frontend's API, a store host's
``/metrics``): JSON answers, Cherami's error body, request bodies decoded into typed
structs, and the middleware that answers a CheramiError with its error body. Nothing
here knows a role."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
from aiohttp import web

from cherami.errors import CheramiError, InvalidRequest, MessageTooLarge, Throttled

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_REQUEST_BYTES = 64 << 20  # a request body beyond this is 413 message_too_large
_json = msgspec.json.Encoder()


class KeyCheck(Protocol):
    """What a listener asks of the API keys: raise unless the Authorization header is
    good for the scope and queue (None: any valid key; with no keys, anyone)."""

    def check(self, header: str | None, scope: None, queue: str | None) -> object: ...


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def error_response(err: CheramiError) -> web.Response:
    """``{"error": {"code", "message"}}`` with the error's status (and ``Retry-After``
    for a refusal that names a wait)."""
    response = json_response(err.to_dict(), err.status)
    if isinstance(err, Throttled):
        response.headers["Retry-After"] = err.retry_after_header
    return response


def internal_error() -> web.Response:
    return json_response({"error": {"code": "internal", "message": "internal error"}}, 500)


class RouteNotFound(CheramiError):
    code, status = "not_found", 404

    def __init__(self) -> None:
        super().__init__("no such endpoint")


@web.middleware
async def cherami_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A CheramiError raised by a handler answered with its error body (a listener
    with no more to map than that, such as a store host's /metrics)."""
    try:
        return await handler(request)
    except CheramiError as err:
        return error_response(err)


async def decode(request: web.Request, type_: type[T], empty_ok: bool = True) -> T:
    """The request's JSON body as ``type_`` (an empty body is ``{}`` when ``empty_ok``);
    InvalidRequest saying what is wrong with it, MessageTooLarge beyond the app's
    ``client_max_size``."""
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
