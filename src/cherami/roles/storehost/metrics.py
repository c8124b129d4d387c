"""``/metrics`` of a store host process in a cluster (``--metrics-port``): a store host
speaks only the store protocol on its port, so its series get a listener of their own.
What it holds: its synced append rounds (one group commit: write and fsync), how many
messages each carried, its open extents and connections (and those refused for no
valid hello), and its metadata calls."""

from __future__ import annotations

from aiohttp import web

from cherami.httpbase import KeyCheck, cherami_errors
from cherami.roles.storehost.server import StoreHostService
from cherami.telemetry import counter, gauge, histogram, process_families, render


def storehost_metrics_app(
    service: StoreHostService, host_id: str, keys: KeyCheck
) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        keys.check(request.headers.get("Authorization"), None, None)  # any valid key
        opened = gauge(
            "cherami_storehost_open_extents",
            "Open extents appended to since the store host started",
            ["host"],
        )
        opened.add_metric([host_id], service.open_extents())
        conns = gauge(
            "cherami_storehost_connections",
            "Store-protocol connections (input and output hosts)",
            ["host"],
        )
        conns.add_metric([host_id], service.connections())
        refused = counter(
            "cherami_storehost_refused_connections",
            "Connections closed without a valid hello: none in time, a wrong one, or one "
            "past the cap of connections yet to say theirs",
            ["host"],
        )
        refused.add_metric([host_id], service.refused)
        body, content_type = render([
            histogram("cherami_storehost_append_round_seconds",
                      "One synced append round of the store host: write and fsync of every "
                      "append pending (a group commit)", ["host"],
                      [([host_id], service.round_seconds)]),
            histogram("cherami_storehost_append_round_messages",
                      "Messages written by one synced append round", ["host"],
                      [([host_id], service.round_messages)]),
            opened, conns, refused, *process_families(),
        ])  # fmt: skip
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application(middlewares=[cherami_errors])  # 401 without a valid key
    app.router.add_get("/metrics", metrics)
    return app
