"""HTTP plumbing shared by the processes' listeners (a frontend's API, a store host's
``/metrics``): JSON answers, Cherami's error body, request bodies decoded into typed
structs, the middleware that answers a CheramiError with its error body, and the
listener's limits (docs/api.md, "Slow and malformed requests"): how long a request's
head and body may take to arrive, and one INFO line, not an aiohttp traceback, for a
request that is not HTTP. Nothing here knows a role."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cherami.errors import (
    CheramiError,
    ConfigError,
    InvalidRequest,
    MessageTooLarge,
    Throttled,
)

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_REQUEST_BYTES = 64 << 20  # a request body beyond this is 413 message_too_large
_json = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()
log = logging.getLogger("cherami.http")


class HttpLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A process's HTTP listener limits: the config's ``http`` object."""

    # seconds from the connect, or the end of the last answer on the connection, to the
    # end of the next request's head; a keep-alive connection idle that long is closed
    header_timeout: float = 10.0
    body_timeout: float = 60.0  # seconds from the end of a request's head to its last byte
    max_streams: int = 10_000  # WebSocket streams this process holds at once
    max_streams_per_key: int = 1_000  # of them, with one API key

    def check(self) -> None:
        for name in ("header_timeout", "body_timeout"):
            if not 0 < getattr(self, name) <= 3600:
                raise ConfigError(f"http.{name} must be over 0 and at most 3600 seconds")
        for name in ("max_streams", "max_streams_per_key"):
            if getattr(self, name) < 1:
                raise ConfigError(f"http.{name} must be at least 1")


LIMITS: web.AppKey[HttpLimits] = web.AppKey("http_limits", HttpLimits)
BODY_TIMED_OUT: web.RequestKey[bool] = web.RequestKey("body_timed_out", bool)


def limits(app: web.Application) -> HttpLimits:
    """The limits ``app`` is served with (``http_runner``); the defaults otherwise."""
    return app.get(LIMITS) or _DEFAULT_LIMITS


_DEFAULT_LIMITS = HttpLimits()


def http_runner(app: web.Application, limits: HttpLimits) -> web.AppRunner:
    """The runner of a listener of ``app``, held to ``limits``: a request's head must
    arrive within ``header_timeout`` (aiohttp's keep-alive timer runs from the connect
    and from each answer, and closes a connection that has not sent a whole head by
    then), its body within ``body_timeout`` (``body_deadline``, where ``app`` has it),
    and a malformed request is one INFO line (``ServerLog``)."""
    app[LIMITS] = limits
    return web.AppRunner(
        app, access_log=None, keepalive_timeout=limits.header_timeout, logger=ServerLog()
    )


async def listen(
    app: web.Application, limits: HttpLimits, host: str, port: int,
    ssl_context: ssl.SSLContext | None,
) -> tuple[web.AppRunner, int]:  # fmt: skip
    """Serve ``app`` on ``host``:``port`` (0: any free port) held to ``limits``; the
    runner (cleanup() stops it) and the port it listens on."""
    runner = http_runner(app, limits)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return runner, int(runner.addresses[0][1])


@web.middleware
async def body_deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Close the connection of a request whose body has not all arrived within
    ``body_timeout`` of its head (a slow-body client holds a handler and its buffers
    for nothing). First in a middleware list, so it covers a forwarded request too."""
    if request.content.is_eof():  # no body, or all of it here already
        return await handler(request)
    seconds = limits(request.app).body_timeout
    timer = asyncio.get_running_loop().call_later(seconds, _body_late, request, seconds)
    try:
        return await handler(request)
    finally:
        timer.cancel()


def caller_gone(request: web.Request) -> bool:
    """Whether the connection the request came on has closed: its answer reaches no one."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _body_late(request: web.Request, seconds: float) -> None:
    if request.content.is_eof() or caller_gone(request):
        return
    request[BODY_TIMED_OUT] = True  # a read it fails is this, not a client gone away
    log.info(
        "%s %s from %s: the request body did not arrive within %g s; connection closed",
        request.method, request.path, request.remote, seconds,
    )  # fmt: skip
    assert request.transport is not None  # not gone (above)
    request.transport.close()


class ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server log (``aiohttp.server``), given to its request handlers, with a
    request that is not HTTP (bytes that are not a request line, a bad header, a line
    too long: aiohttp answers 400 and closes) told as one INFO line naming the peer,
    not an ERROR with aiohttp's traceback."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        err = kwargs.get("exc_info")
        if isinstance(err, HttpProcessingError):
            peer = args[0] if args else "?"
            what = " ".join(str(err.message).split())[:200]
            log.info("malformed request from %s: %s: %s", peer, type(err).__name__, what)
            return
        super().log(level, msg, *args, **kwargs)


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


# the request's WebSocketResponse once it is prepared
UPGRADED: web.RequestKey[web.WebSocketResponse] = web.RequestKey("upgraded", web.WebSocketResponse)
INTERNAL_ERROR = 1011  # the WebSocket close code of an unexpected server error


async def upgrade(request: web.Request, ws: web.WebSocketResponse) -> None:
    """Prepare ``ws`` (the HTTP upgrade) and mark the request upgraded: an error raised
    after this point closes the WebSocket (``after_upgrade``), it is never an HTTP
    answer written into a connection that now speaks WebSocket frames."""
    await ws.prepare(request)
    request[UPGRADED] = ws


async def after_upgrade(request: web.Request, answer: web.StreamResponse) -> web.StreamResponse:
    """``answer`` as it is, unless the request was upgraded and ``answer`` is an error
    answer made for it (a handler that failed after its upgrade): then the WebSocket is
    closed with 1011 and the error's code as its reason, and that is the answer."""
    ws: web.WebSocketResponse | None = request.get(UPGRADED)
    if ws is None or answer is ws:
        return answer
    code = "internal"
    if isinstance(answer, web.Response) and isinstance(answer.body, bytes):
        try:
            code = str(_json_decoder.decode(answer.body)["error"]["code"])[:100]
        except (msgspec.DecodeError, KeyError, TypeError):
            pass
    await ws.close(code=INTERNAL_ERROR, message=code.encode())
    return ws


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
