"""``GET /v1/cluster``: every host (role, zone, address, alive, latest load report) and
every queue's open extents (input host, store hosts, current rate), from the hosts
table and the extents; and the per-extent figures ``GET /v1/queues/{q}/extents`` adds."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from cherami.membership import INPUTHOST, OUTPUTHOST
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import OPEN, Extent, Host


@dataclass
class HostView:
    """The hosts table read once: addresses by id and per-extent rates from the live
    hosts' latest reports."""

    hosts: list[Host]
    now: float
    dead_after: float  # a host silent this long is not alive (the process's timing)

    def __post_init__(self) -> None:
        self._addresses = {h.id: h.address for h in self.hosts}

    def alive(self, host: Host) -> bool:
        return self.now - host.heartbeat_at <= self.dead_after

    def address(self, host_id: str) -> str:
        return self._addresses.get(host_id, "")

    def rates(self, role: str) -> dict[str, float]:
        """msgs/s per extent: in, from input hosts; out, from output hosts."""
        rates: dict[str, float] = {}
        for host in self.hosts:
            if host.role != role or host.load is None or not self.alive(host):
                continue
            for extent, load in host.load.extents.items():
                rate = load.msgs_in if role == INPUTHOST else load.msgs_out
                rates[extent] = rates.get(extent, 0.0) + rate
        return rates


async def read_hosts(metadata: MetadataStore, dead_after: float) -> HostView:
    return HostView(await metadata.list_hosts(None, alive_within=None), time.time(), dead_after)


def host_json(view: HostView, host: Host) -> dict[str, Any]:
    return {
        "id": host.id,
        "role": host.role,
        "zone": host.zone,
        "address": host.address,
        "alive": view.alive(host),
        "heartbeat_age_seconds": round(max(0.0, view.now - host.heartbeat_at), 3),
        "load": msgspec.to_builtins(host.load) if host.load is not None else None,
    }


def extent_json(
    view: HostView, extent: Extent, rates: dict[str, float], out: dict[str, float]
) -> dict[str, Any]:
    return {
        "id": extent.id,
        "kind": extent.kind,
        "input_host": view.address(extent.input_host),
        "input_host_id": extent.input_host,
        "stores": [view.address(s) for s in extent.stores],
        "store_ids": extent.stores,
        "rate": rates.get(extent.id, 0.0),
        "rate_out": out.get(extent.id, 0.0),
    }


async def cluster_json(metadata: MetadataStore, dead_after: float) -> dict[str, Any]:
    view = await read_hosts(metadata, dead_after)
    rates, out = view.rates(INPUTHOST), view.rates(OUTPUTHOST)
    queues = []
    for queue in await metadata.list_queues():
        extents = await metadata.list_extents(queue.name, (OPEN,))
        queues.append({
            "name": queue.name,
            "dlq_of": queue.dlq_of,
            "rate": round(sum(rates.get(e.id, 0.0) for e in extents), 1),
            "extents": [extent_json(view, e, rates, out) for e in extents],
        })  # fmt: skip
    return {"hosts": [host_json(view, h) for h in view.hosts], "queues": queues}
