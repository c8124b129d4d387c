"""The SQS endpoint's listener: one route takes every request, in either protocol,
checks its signature against the auth file's keys, runs the action and answers in the
request's protocol. No action's error is a 500 unless it is a bug."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from cherami.errors import CheramiError
from cherami.httpbase import MAX_REQUEST_BYTES, body_deadline
from cherami.roles.frontend.auth import ApiKey, KeyRing, Scope
from cherami.roles.frontend.context import Roles
from cherami.roles.frontend.sqs import sigv4
from cherami.roles.frontend.sqs.backend import Backend
from cherami.roles.frontend.sqs.errors import (
    SqsError,
    access_denied,
    from_cherami,
    internal,
    unknown_action,
    unsupported,
)
from cherami.roles.frontend.sqs.messages import MessageActions
from cherami.roles.frontend.sqs.movetasks import MoveTasks
from cherami.roles.frontend.sqs.protocol import SqsRequest, answer, error_answer, parse
from cherami.roles.frontend.sqs.queues import Caller, QueueActions
from cherami.roles.frontend.sqs.settings import SettingsStore

log = logging.getLogger("cherami.frontend.sqs")

DEFAULT_REGION = "us-east-1"
ACCESS_KEY_DIGITS = 20  # an access key id's length, as AWS's
Action = Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]
_NOT_BUILT = ("AddPermission", "RemovePermission")


def _access_key_id(secret: str) -> str:
    """An access key id: the start of the SHA-256 of the secret access key, in upper
    case (it travels in clear, so it tells nothing of the secret)."""
    return hashlib.sha256(secret.encode()).hexdigest()[:ACCESS_KEY_DIGITS].upper()


def secret_access_key(key: ApiKey) -> str:
    """An API key's secret access key: its SHA-256 in hex, the auth file's
    ``key_sha256``."""
    return key.digest().hex()


def access_key_id(key: ApiKey) -> str:
    return _access_key_id(secret_access_key(key))


def credentials(api_key: str) -> tuple[str, str]:
    """(access key id, secret access key) of a key in clear, for a client."""
    secret = hashlib.sha256(api_key.encode()).hexdigest()
    return _access_key_id(secret), secret


class SqsEndpoint:
    def __init__(self, roles: Roles, data_dir: str | None, holder: str) -> None:
        self.keys: KeyRing = roles.keys
        self.data_dir = data_dir
        backend = Backend(roles)
        self.settings = settings = SettingsStore(roles.metadata)
        self.tasks = MoveTasks(backend, holder)
        self.queues = QueueActions(backend, settings, self.tasks)
        self.messages = MessageActions(backend, settings)
        self.actions: dict[str, Action] = {}
        self._ids: tuple[object, dict[str, ApiKey]] = (None, {})  # (the ring's list, by id)
        for group in (self.queues, self.messages):
            for name in dir(group):
                if name[:1].isupper():
                    self.actions[name] = getattr(group, name)

    async def start(self, _: web.Application) -> None:
        """Move an older sqs.json in, and watch the running move tasks; with the
        metadata store out, at the next start (a listing watches a task meanwhile)."""
        try:
            await self.settings.migrate(self.data_dir)
            await self.tasks.resume()
        except CheramiError as err:
            log.warning("SQS endpoint: the metadata store did not answer at start: %s", err)

    async def stop(self, _: web.Application) -> None:
        await self.tasks.close()

    def _key_of(self, access_key: str) -> ApiKey | None:
        """The key of an access key id (ids travel in clear: a lookup, not a compare)."""
        keys = self.keys.keys  # a new tuple after each reload (SIGHUP)
        if self._ids[0] is not keys:
            self._ids = (keys, {access_key_id(key): key for key in keys})
        return self._ids[1].get(access_key.upper())

    def _caller(self, request: web.Request, body: bytes) -> Caller:
        base = f"{request.scheme}://{request.host}"
        headers = list(request.headers.items())
        if not self.keys.enabled:  # loopback only, as the HTTP API: any signature or none
            region = DEFAULT_REGION
            header = request.headers.get("Authorization")
            sender = "anonymous"
            if header:
                try:
                    claimed = sigv4.parse_authorization(header)
                    region, sender = claimed.region, claimed.access_key
                except SqsError:
                    pass
            return Caller(_allow_all, region, base, None, sender)

        def secret_of(access_key: str) -> str | None:
            key = self._key_of(access_key)
            return None if key is None else secret_access_key(key)

        path, _, query = request.raw_path.partition("?")
        signed = sigv4.verify(request.method, path, query, headers, body, secret_of, time.time())
        key = self._key_of(signed.access_key)
        assert key is not None
        return Caller(_allow(key), signed.region, base, key, signed.access_key)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        query = "X-Amz-Target" not in request.headers
        req: SqsRequest | None = None
        request_id = str(uuid.uuid4())
        try:
            caller = self._caller(request, body)  # before reading anything of the request
            req = parse(request, body, request_id)
            if req.action in _NOT_BUILT:
                raise unsupported(
                    f"{req.action} is not supported: access is by the auth file's keys."
                )
            action = self.actions.get(req.action)
            if action is None:
                raise unknown_action(req.action)
            return answer(req, await action(caller, req.params))
        except SqsError as err:
            return error_answer(err, query, request_id)
        except CheramiError as err:
            return error_answer(from_cherami(err, _queue_hint(req)), query, request_id)
        except Exception:
            log.exception("SQS %s failed", req.action if req else "request")
            return error_answer(internal(), query, request_id)


def _queue_hint(req: SqsRequest | None) -> str:
    if req is None:
        return ""
    url = req.params.get("QueueUrl") or req.params.get("QueueName") or ""
    return str(url).rstrip("/").rsplit("/", 1)[-1]


def _allow_all(scope: Scope | None, queue: str | None) -> None:
    return None


def _allow(key: ApiKey) -> Callable[[Scope | None, str | None], None]:
    def allow(scope: Scope | None, queue: str | None) -> None:
        if scope is not None and scope not in key.scopes and "admin" not in key.scopes:
            raise access_denied(f"the key lacks the {scope} scope")
        if queue is not None and not any(queue.startswith(p) for p in key.prefixes):
            raise access_denied(f"the key does not cover queue {queue}")

    return allow


def build_sqs_app(roles: Roles, data_dir: str | None, holder: str) -> web.Application:
    """The SQS endpoint over a process's roles (served on its own port). ``holder``
    names the process in the leases of the message move tasks it runs: the same after a
    restart (its host id), so it goes on with its tasks at once."""
    endpoint = SqsEndpoint(roles, data_dir, holder)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[body_deadline])
    app.router.add_route("*", "/{tail:.*}", endpoint.handle)
    app.on_startup.append(endpoint.start)
    app.on_cleanup.append(endpoint.stop)
    return app
