"""Open a metadata store from a URL: ``sqlite:///path`` (or a plain path) for one
machine, ``postgresql://...`` for a cluster."""

from __future__ import annotations

import asyncio
import re
from typing import Literal
from urllib.parse import unquote

import msgspec
import psycopg
import psycopg_pool

from cherami.errors import ConfigError, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.postgres import PostgresMetadataStore
from cherami.metadata.postgres_schema import check_schema
from cherami.metadata.sqlite import SqliteMetadataStore
from cherami.telemetry import timed_metadata

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_POSTGRES = ("postgresql", "postgres")


class MetadataTarget(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["sqlite", "postgres"]
    location: str  # a file path, or a libpq URL without the schema parameter
    schema: str = "cherami"


_CONNINFO = re.compile(r"^\s*(host|hostaddr|port|dbname|user|service)\s*=")


def parse_metadata_url(url: str) -> MetadataTarget:
    """Raises ConfigError for anything but a sqlite or postgres URL or a plain path."""
    if not url.strip():
        raise ConfigError("the metadata URL is empty")
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    has_authority = url[len(scheme) + 1 :].startswith("//")
    if scheme == "sqlite" and has_authority:
        return MetadataTarget(kind="sqlite", location=_sqlite_path(url))
    if scheme in _POSTGRES and has_authority:
        location, schema = _strip_schema(scheme + url[len(scheme) :])
        return MetadataTarget(kind="postgres", location=location, schema=schema)
    if scheme in ("sqlite", *_POSTGRES):
        raise ConfigError(f"metadata URL {url!r} must start with {scheme}://")
    if match and has_authority:
        raise ConfigError(f"metadata URL {url!r}: expected sqlite://, postgresql:// or postgres://")
    if _CONNINFO.match(url):  # it was opened as a SQLite file of that name
        raise ConfigError(
            f"metadata {url!r} looks like libpq's key=value form: give it as a URL, "
            "e.g. postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write"
        )
    return MetadataTarget(kind="sqlite", location=url)


def _sqlite_path(url: str) -> str:
    rest = url[len("sqlite://") :]  # "/absolute/path" or "relative/path"
    if "?" in rest or "#" in rest:
        raise ConfigError(f"metadata URL {url!r}: sqlite URLs take no parameters")
    if not rest:
        raise ConfigError(f"metadata URL {url!r} names no file")
    return unquote(rest)


def _strip_schema(url: str) -> tuple[str, str]:
    """Split off the ``schema`` query parameter, passing the rest to libpq untouched."""
    base, _, fragment = url.partition("#")
    base, _, query = base.partition("?")
    params = [p for p in query.split("&") if p]
    schemas = [unquote(p.partition("=")[2]) for p in params if p.partition("=")[0] == "schema"]
    if len(schemas) > 1:
        raise ConfigError(f"metadata URL {url!r} names more than one schema")
    kept = [p for p in params if p.partition("=")[0] != "schema"]
    location = base + ("?" + "&".join(kept) if kept else "") + ("#" + fragment if fragment else "")
    return location, check_schema(schemas[0]) if schemas else "cherami"


async def open_metadata(url: str) -> MetadataStore:
    """Raises ConfigError for a bad URL, Unavailable for a PostgreSQL server that cannot
    be reached or takes no connection now (refused, timed out, ``too many clients``)."""
    target = parse_metadata_url(url)
    store: MetadataStore
    if target.kind == "postgres":
        try:
            store = await PostgresMetadataStore.connect(target.location, target.schema)
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as err:
            # libpq's message spans lines ("Is the server running ...?"): one line
            reason = " ".join(str(err).split())
            raise Unavailable(f"metadata database unreachable: {reason}") from err
    else:  # opening creates the file and its tables: keep that off the event loop
        store = await asyncio.to_thread(SqliteMetadataStore, target.location)
    return timed_metadata(store)  # each call timed for /metrics
