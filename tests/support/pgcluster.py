"""A LocalCluster on the local PostgreSQL (127.0.0.1:5432, database ``test``) in a schema
of its own, dropped when the cluster is taken down."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cherami.devcluster.local import LocalCluster

PG = "postgresql://postgres@127.0.0.1:5432/test"


@contextlib.contextmanager
def cluster_on_postgres(
    root: Path, counts: dict[str, int], extra_args: list[str] | None = None
) -> Iterator[tuple[LocalCluster, str]]:
    """The cluster, up, and its metadata schema's name. ``extra_args`` go to every
    ``cherami serve`` of it."""
    schema = f"c_{uuid.uuid4().hex[:12]}"
    local = LocalCluster(root, f"{PG}?schema={schema}", counts, extra_args=extra_args)
    try:
        local.up()
        yield local, schema
    finally:
        local.down()
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def cluster_fixture(
    factory: pytest.TempPathFactory,
    name: str,
    counts: dict[str, int],
    extra_args: list[str] | None = None,
) -> Iterator[LocalCluster]:
    """The body of a module-scoped cluster fixture: ``yield from cluster_fixture(...)``."""
    root = factory.mktemp(name) / "cluster"
    with cluster_on_postgres(root, counts, extra_args) as (local, _schema):
        yield local
