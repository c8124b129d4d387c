"""A ``NetnsCluster`` whose metadata store is a private PostgreSQL listening on the
bridge's gateway (the root namespace), so that every host reaches it over the network
and a cut can take it away from some of them. Everything is removed afterwards: the
roles, the database and the network, which is then checked for leftovers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from cherami.devcluster.netns import NetnsCluster
from tests.support.pg import PrivatePostgres


@contextlib.contextmanager
def netns_cluster_on_pg(
    root: Path,
    counts: dict[str, int],
    zones: list[str] | None = None,
    cpu_quota: float | dict[str, float] | None = None,
    extra_args: list[str] | None = None,
) -> Iterator[NetnsCluster]:
    cluster = NetnsCluster(
        root, "", counts, zones=zones, cpu_quota=cpu_quota, extra_args=extra_args
    )
    network = cluster.network
    with contextlib.ExitStack() as undo:  # undone last first: roles, database, network
        undo.callback(network.teardown)
        pg = PrivatePostgres(listen=network.up().gateway)
        undo.callback(pg.remove)
        undo.callback(cluster.down)
        cluster.metadata = pg.start().url()
        cluster.up()
        yield cluster
    left = network.leftovers()
    if left:
        raise RuntimeError(f"the network left {left}")
