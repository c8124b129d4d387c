"""``cherami cluster status``: the hosts and where each queue's open extents live, from
``GET /v1/cluster``, as tables or (``--json``) as the server's JSON."""

from __future__ import annotations

from typing import Any

import click

from cherami.cli.cluster import cluster
from cherami.cli.connection import ClientFactory, connection_options, echo_json, run


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 30):.1f}G"


def host_rows(hosts: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["HOST", "ROLE", "ZONE", "ADDRESS", "ALIVE", "CPU", "EXTENTS", "IN", "OUT",
             "CONNS", "DISK FREE", "APPEND P99"]]  # fmt: skip
    for h in hosts:
        load = h.get("load") or {}
        extents = load.get("extents", {}).values()
        rows.append([
            h["id"], h["role"], h["zone"] or "-", h["address"], "yes" if h["alive"] else "no",
            f"{load.get('cpu', 0.0):.2f}" if load else "-",
            str(load.get("open_extents", 0)) if load else "-",
            _rate(sum(e.get("msgs_in", 0.0) for e in extents)),
            _rate(sum(e.get("msgs_out", 0.0) for e in extents)),
            str(load.get("connections", "-")), _gib(load.get("disk_free_bytes")),
            f"{load['append_p99_ms']:.2f}ms" if "append_p99_ms" in load else "-",
        ])  # fmt: skip
    return rows


def extent_rows(queues: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["QUEUE", "EXTENT", "KIND", "INPUT HOST", "STORE HOSTS", "RATE"]]
    for q in queues:
        for e in q["extents"]:
            rows.append([q["name"], e["id"], e["kind"], e["input_host"] or e["input_host_id"],
                         ",".join(e["stores"]), _rate(e["rate"])])  # fmt: skip
    return rows


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print GET /v1/cluster as JSON.")
@connection_options
def status(client: ClientFactory, as_json: bool) -> None:
    """Hosts (role, zone, address, alive, load) and every queue's open extents."""
    body = run(client, lambda c: c.request("GET", "/v1/cluster"))
    if as_json:
        echo_json(body)
        return
    click.echo(table(host_rows(body["hosts"])))
    click.echo()
    click.echo(table(extent_rows(body["queues"])))
