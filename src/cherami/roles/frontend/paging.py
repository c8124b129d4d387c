"""Listings a page at a time (``GET /v1/queues``, ``GET /v1/queues/{queue}/groups``;
docs/api.md "List"): the ``limit``, ``cursor`` and ``prefix`` query parameters, the
opaque cursor, and the page's answer."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from aiohttp import web

from cherami.errors import InvalidRequest

DEFAULT_LIMIT = 100  # a listing without ``limit`` answers this many at the most
MAX_LIMIT = 1000
# a prefix of a name (metadata/models.py NAME_PATTERN): names are at most 128 characters
PREFIX_PATTERN = r"^[A-Za-z0-9._-]{0,128}$"
# unpadded base64url of a name of up to 128 characters: at most 172 characters
CURSOR_PATTERN = r"^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?$"
MAX_CURSOR = 172

_DIGITS = re.compile(r"[0-9]{1,9}")
_PREFIX = re.compile(PREFIX_PATTERN)
_CURSOR = re.compile(CURSOR_PATTERN)
_NAME_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


class Page(NamedTuple):
    prefix: str  # "" for every name
    after: str | None  # list the names above this one (None: from the first)
    limit: int


def page_asked(request: web.Request) -> Page:
    """The page a listing request asks for; InvalidRequest (400) for a ``limit`` that
    is not an integer from 1 to MAX_LIMIT, a ``prefix`` no name can start with, or a
    malformed ``cursor``. An empty ``cursor`` asks for the first page."""
    query = request.query
    limit = limit_asked(request)
    prefix = query.get("prefix", "")
    if not _PREFIX.fullmatch(prefix):
        raise InvalidRequest(
            "prefix must be up to 128 characters from A-Z a-z 0-9 . _ - (those of a name)"
        )
    cursor = query.get("cursor", "")
    return Page(prefix, decode_cursor(cursor) if cursor else None, limit)


def limit_asked(request: web.Request) -> int:
    """The ``limit`` query parameter: DEFAULT_LIMIT without one; InvalidRequest (400) for
    one that is not an integer from 1 to MAX_LIMIT."""
    text = request.query.get("limit")
    if text is None:
        return DEFAULT_LIMIT
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}, not {text!r}")
    return int(text)


def encode_cursor(name: str) -> str:
    """The cursor of the page after ``name``: opaque to clients (unpadded base64url)."""
    return base64.urlsafe_b64encode(name.encode()).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> str:
    """The name a cursor lists after. Any well-formed cursor is a place in the listing:
    bytes that are not a name's (a cursor that did not come from here) are read as a
    string every name compares with as it does with them, so it never lists a name
    twice or skips one. InvalidRequest for one that is not unpadded base64url."""
    if len(cursor) > MAX_CURSOR or not _CURSOR.fullmatch(cursor):
        raise InvalidRequest("malformed cursor: pass back the cursor a page answered, unchanged")
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    for i, byte in enumerate(raw):
        if byte not in _NAME_BYTES:
            # a name differs from ``raw`` at i at the latest, so only raw[:i + 1] counts;
            # 0x01..0x7f keep the order there and are text to both stores
            return raw[:i].decode("ascii") + chr(min(max(byte, 1), 0x7F))
    return raw.decode("ascii")


class Named(Protocol):
    name: str


R = TypeVar("R", bound=Named)


def page_answer(
    key: str, rows: Sequence[R], page: Page, record: Callable[[R], dict[str, Any]]
) -> dict[str, Any]:
    """The answer to a page: ``rows`` were read with ``limit + 1``, so one more than
    the page says another follows (its cursor), and the last page has cursor null."""
    shown = rows[: page.limit]
    more = len(rows) > page.limit
    return {
        key: [record(r) for r in shown],
        "cursor": encode_cursor(shown[-1].name) if more else None,
    }
