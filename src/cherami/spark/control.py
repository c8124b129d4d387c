"""The few frontend calls the Spark source makes from the driver, over blocking HTTP
(the driver-side reader runs in a plain Python process, without an event loop)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from base64 import b64decode
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import msgspec

from cherami.errors import Unavailable, error_from_response
from cherami.wire import tls
from cherami.wire.grants import ReadGrant
from cherami.wire.store import PLAIN

Offsets = dict[str, int]


@dataclass(frozen=True, slots=True)
class ExtentView:
    """What the frontend says about one extent of a queue."""

    id: str
    kind: str
    status: str
    stores: tuple[str, ...]
    last_seq: int
    created_ms: int

    @property
    def plain(self) -> bool:
        return self.kind == PLAIN


class ControlClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout
        context = tls.public_client(self.url, None)  # https: CHERAMI_TLS_CA, else the system's
        self._tls = context if isinstance(context, ssl.SSLContext) else None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = msgspec.json.encode(body) if body is not None else None
        req = urllib.request.Request(self.url + path, data, self._headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._tls) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise error_from_response(err.code, err.read()) from None
        except (urllib.error.URLError, OSError) as err:
            raise Unavailable(f"{self.url}: {err}") from err
        return msgspec.json.decode(raw) if raw else None

    @staticmethod
    def _q(queue: str) -> str:
        return f"/v1/queues/{quote(queue, safe='')}"

    def _g(self, queue: str, group: str) -> str:
        return f"{self._q(queue)}/groups/{quote(group, safe='')}"

    def extents(self, queue: str) -> list[ExtentView]:
        reply = self.request("GET", self._q(queue) + "/extents")
        return [
            ExtentView(e["id"], e["kind"], e["status"], tuple(e["stores"]), e["last_seq"],
                       _ms(e["created_at"]))
            for e in reply["extents"]
        ]  # fmt: skip

    def group_offsets(self, queue: str, group: str) -> dict[str, Any]:
        """``{"offsets": {extent: next_seq}, "start_ms", "type"}`` of a group."""
        return self.request("GET", self._g(queue, group) + "/offsets")  # type: ignore[no-any-return]

    def offsets(self, queue: str, group: str) -> tuple[Offsets, int]:
        """The group's committed offsets and its start time (ms; 0: from the earliest)."""
        reply = self.group_offsets(queue, group)
        return dict(reply["offsets"]), int(reply.get("start_ms", 0))

    def read_grants(
        self, queue: str, extents: list[str], lifetime: float | None = None
    ) -> dict[str, ReadGrant]:
        """A read grant for each extent of the queue (docs/api.md, "Read grants"):
        what a reader without the cluster secret shows the store hosts."""
        body: dict[str, Any] = {"extents": extents}
        if lifetime is not None:
            body["lifetime_seconds"] = lifetime
        reply = self.request("POST", self._q(queue) + "/read-grants", body)
        expires_ms = _ms(reply["expires_at"])
        lifetime_ms = int(reply["lifetime_seconds"] * 1000)
        return {
            g["extent"]: ReadGrant(b64decode(g["token"]), b64decode(g["key"]), expires_ms,
                                   lifetime_ms)
            for g in reply["grants"]
        }  # fmt: skip

    def commit(self, queue: str, group: str, offsets: Offsets) -> Offsets:
        """Move the group's ack levels forward to ``offsets`` (the server never moves
        them back); returns the offsets the group holds now."""
        reply = self.request("POST", self._g(queue, group) + "/offsets", {"offsets": offsets})
        return dict(reply["offsets"])


def _ms(rfc3339: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)
