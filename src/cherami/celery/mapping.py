# mypy: disallow-untyped-calls=False
"""How kombu's names, URLs and messages map onto Cherami's (pure functions)."""

from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from kombu.utils.json import loads

from cherami.client.models import Received

DEFAULT_PORT = 8080
DEFAULT_GROUP = "celery"
DEFAULT_CREDIT = 100  # a consumed queue's credit when the channel sets no prefetch count
MAX_DELAY = 30 * 86400.0  # the longest Cherami delay; a later eta is published again
ENVELOPE = "kombu"  # the attribute holding the kombu message without its body
BIND_PREFIX = "kombu.bind."
FANOUT_PREFIX = "kombu.fanout."
ROUTE_TTL = 2.0  # seconds a routing-key lookup of another process's bindings is kept
_INVALID = re.compile(r"[^A-Za-z0-9._-]")


def cherami_name(name: str) -> str:
    """The Cherami queue (or group) of a kombu queue: the same name when it is a valid
    Cherami name, else with each other character as ``_XX`` (its UTF-8 bytes in hex), a
    ``q`` ahead of a name that does not start with a letter or digit, and a name over
    128 characters cut with a hash of the whole."""
    out = _INVALID.sub(lambda m: "".join(f"_{b:02x}" for b in m.group().encode()), name)
    if not out[:1].isalnum():
        out = "q" + out
    if len(out) > 128:
        out = out[:111] + "-" + hashlib.sha1(name.encode()).hexdigest()[:16]
    return out


def eta_delay(headers: dict[str, Any] | None, now: float | None = None) -> float:
    """Seconds until a Celery message's ``eta`` header (0 without one, or one past)."""
    eta = (headers or {}).get("eta")
    if not eta:
        return 0.0
    try:
        when = datetime.fromisoformat(str(eta))
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def endpoint(conninfo: Any) -> tuple[str, str | None, str | None]:
    """The Cherami URL, API key and CA file of a kombu connection: ``cherami://[:KEY@]HOST[:PORT]``
    (``https`` when the connection has ``ssl``), or ``cherami+https://[:KEY@]HOST[:PORT]``;
    the transport options ``api_key`` and ``tls_ca`` take precedence."""
    options = conninfo.transport_options
    host = conninfo.hostname or "127.0.0.1"
    if "://" in host:  # cherami+http(s)://...: kombu leaves the whole URL here
        parts = urlsplit(host)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"cherami broker URL: unknown scheme cherami+{parts.scheme}")
        scheme, hostname, port, password = parts.scheme, parts.hostname, parts.port, parts.password
    else:
        scheme = "https" if conninfo.ssl else "http"
        hostname, port, password = host, conninfo.port, conninfo.password
    url = f"{scheme}://{hostname or '127.0.0.1'}:{port or DEFAULT_PORT}"
    api_key = options.get("api_key") or password or None
    ssl = conninfo.ssl if isinstance(conninfo.ssl, dict) else {}
    tls_ca = options.get("tls_ca") or ssl.get("ca_certs") or None
    return url, api_key, tls_ca


def fanout_queue(exchange: str) -> str:
    """The Cherami queue of a fanout exchange: each queue bound to it is a group of it."""
    return cherami_name(f"{FANOUT_PREFIX}{exchange}")


def route_queue(exchange: str, routing_key: str) -> str:
    return cherami_name(f"{BIND_PREFIX}{exchange}.{routing_key}")


def payload_of(message: Received) -> dict[str, Any]:
    envelope = (message.attributes or {}).get(ENVELOPE)
    if envelope is None:  # not published through kombu: Celery refuses it as unknown
        return {"body": message.body, "headers": {}, "properties": {"delivery_info": {}},
                "content-type": None, "content-encoding": None}  # fmt: skip
    payload: dict[str, Any] = loads(envelope)
    payload["body"] = message.body.decode() if payload.pop("body_is_text", False) else message.body
    return payload
