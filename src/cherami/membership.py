"""Host membership: every role process heartbeats into the metadata store; a host that
misses heartbeats for timing.dead_after seconds is dead. Roles import it; it imports no role
(the store hosts' directory keeps itself in step with it: roles/storehost/directory.py)."""

from __future__ import annotations

import logging
import os
import secrets
import time

from cherami.loadmeter import LoadMeter
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Host
from cherami.periodic import Periodic

log = logging.getLogger("cherami.cluster.membership")


STOREHOST, INPUTHOST, OUTPUTHOST, CONTROLLER, FRONTEND = (
    "storehost", "inputhost", "outputhost", "controller", "frontend",
)  # fmt: skip


def host_id(data_dir: str, role: str) -> str:
    """A host's id, kept in its data dir so that it survives restarts."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, f"{role}.id")
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        new = f"{role}-{secrets.token_hex(4)}"
        with open(path, "w") as f:
            f.write(new)
        return new


class Membership:
    def __init__(
        self, metadata: MetadataStore, host: str, role: str, address: str,
        zone: str = "", meter: LoadMeter | None = None, *, interval: float,
    ) -> None:  # fmt: skip
        """A beat every ``interval`` seconds (timing.heartbeat_interval), each with the
        ``meter``'s latest load report (made every 2 s)."""
        self.metadata = metadata
        self.host = Host(id=host, role=role, address=address, heartbeat_at=0.0, zone=zone)
        self.meter = meter
        self._beats = Periodic(f"heartbeat of {host}", interval, self.beat)

    async def start(self) -> None:
        await self.beat()
        self._beats.start()

    async def beat(self) -> None:
        self.host.heartbeat_at = time.time()
        if self.meter is not None:
            self.host.load = self.meter.report()
        await self.metadata.heartbeat(self.host)

    async def stop(self) -> None:
        await self._beats.stop()


async def live_hosts(metadata: MetadataStore, role: str, dead_after: float) -> list[Host]:
    """The hosts of ``role`` heard from within ``dead_after`` (the process's timing)."""
    return await metadata.list_hosts(role, alive_within=dead_after)
