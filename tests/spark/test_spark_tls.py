"""The Spark source against a cluster with TLS on every listener and internal link
(issue 14): the driver's frontend calls go over https and the workers read the store
hosts over TLS (replicas listed as ``tls://host:port``), verified with the test CA that
CHERAMI_TLS_CA names (in the environment the session was started with: Spark's Python
workers inherit it), with read grants from the cluster's frontend: the job holds no
cluster secret."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cherami.client.asyncclient import AsyncClient
from tests.support.pgcluster import cluster_on_postgres
from tests.support.tlscerts import Certs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def test_a_batch_read_of_a_tls_cluster(
    spark: SparkSession, tls_certs: Certs, tmp_path: Path
) -> None:
    # the session's workers were started with the test CA in their environment and no
    # cluster secret (conftest.py); the cluster makes its own
    certs = tls_certs
    assert not any(k.startswith("CHERAMI_CLUSTER_SECRET") for k in os.environ)
    tls = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key), "--tls-ca", str(certs.ca)]
    counts = {"storehost": 2, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 1}
    with cluster_on_postgres(tmp_path / "c", counts, extra_args=tls) as (local, _schema):
        bodies = [f"m-{i}" for i in range(500)]

        async def setup() -> list[str]:
            async with AsyncClient(local.url) as client:
                await client.create_queue("tls-read", replicas=2)
                ids = await client.publish("tls-read", bodies)
                extents = await client.request("GET", "/v1/queues/tls-read/extents")
                stores = [s for e in extents["extents"] for s in e["stores"]]
                assert stores and all(s.startswith("tls://") for s in stores), stores
                return ids

        ids = asyncio.run(setup())
        df = spark.read.format("cherami").option("url", local.url).option("queue", "tls-read")
        rows = df.load().select("id").collect()
        assert sorted(r.id for r in rows) == sorted(ids)
