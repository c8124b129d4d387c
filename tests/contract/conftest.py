"""Metadata backends for the contract suite: a SQLite file, or a PostgreSQL schema of the
test's own on the local server (dropped afterwards). An unreachable server fails the
postgres tests; it never skips them."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from cherami.metadata.base import MetadataStore
from cherami.metadata.postgres import PostgresMetadataStore
from cherami.metadata.sqlite import SqliteMetadataStore

POSTGRES_URL = os.environ.get(
    "CHERAMI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test?connect_timeout=5"
)


async def drop_schema(schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


class MetadataBackend:
    """Opens any number of stores on one database, and closes them all at the end."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.path = str(tmp_path / "metadata.db")
        self.schema = f"t_{uuid.uuid4().hex}"
        self._stores: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        store: MetadataStore
        if self.kind == "postgres":
            store = await PostgresMetadataStore.connect(POSTGRES_URL, self.schema)
        else:
            store = SqliteMetadataStore(self.path)
        self._stores.append(store)
        return store

    async def close(self) -> None:
        for store in self._stores:
            await store.close()
        if self.kind == "postgres":
            await drop_schema(self.schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def metadata_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[MetadataBackend]:
    backend = MetadataBackend(request.param, tmp_path)
    yield backend
    await backend.close()


@pytest.fixture
async def meta(metadata_backend: MetadataBackend) -> MetadataStore:
    return await metadata_backend.open()


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    """A schema name of this test's own on the local server, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex}"
    yield schema
    await drop_schema(schema)
