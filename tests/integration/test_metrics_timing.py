"""/metrics judges a host's heartbeat by the node's configured timing, not the default."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from cherami.metadata.models import Host
from cherami.metadata.sqlite import SqliteMetadataStore
from tests.integration.test_metrics import scrape, value
from tests.support.server import ServerProcess


async def _beat(db: Path, host: Host) -> None:
    store = SqliteMetadataStore(str(db))
    try:
        await store.heartbeat(host)
    finally:
        await store.close()


def test_host_up_follows_the_configured_dead_after(tmp_path: Path) -> None:
    """A host that beat 10 s ago is up under ``dead_after: 30`` (cherami_host_up said 0:
    it was judged by the default 3 s whatever the configuration said)."""
    config = tmp_path / "node.json"
    config.write_text(json.dumps({"timing": {"dead_after": 30}}))
    node = ServerProcess(tmp_path / "node", stores=1, extra=["--config", str(config)]).start()
    try:
        quiet = Host(id="inputhost-quiet", role="inputhost", address="127.0.0.1:9",
                     heartbeat_at=time.time() - 10)  # fmt: skip
        asyncio.run(_beat(tmp_path / "node" / "metadata.db", quiet))
        with httpx.Client(base_url=node.url, timeout=30) as http:
            samples = scrape(http)
        labels = {"host": "inputhost-quiet", "role": "inputhost", "zone": ""}
        assert value(samples, "cherami_host_up", **labels) == 1.0
    finally:
        node.stop()
