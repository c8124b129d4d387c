"""``cherami cluster up|down``: a local multi-process cluster on loopback, or with
``--netns`` each process on a host of its own (a Linux network namespace)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cherami.cli.main import cli


@cli.group()
def cluster() -> None:
    """Run every role as its own process on this machine (loopback)."""


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True, help="State, data and logs.")
@click.option("--metadata", help="postgresql://... or sqlite:///path (default: SQLite in --dir).")
@click.option("--stores", default=3, show_default=True)
@click.option("--inputs", default=2, show_default=True)
@click.option("--outputs", default=2, show_default=True)
@click.option("--controllers", default=2, show_default=True)
@click.option("--frontends", default=1, show_default=True)
@click.option("--port", default=8080, show_default=True, help="Port of the first frontend.")
@click.option("--netns", is_flag=True, help="Each process in a network namespace (root).")
@click.option("--zones", default="", help="With --netns: zone names (a,b,c), dealt in turn.")
@click.option("--cpu-quota", type=float, help="With --netns: CPUs per host (0.1 = 10%).")
def up(root: str, metadata: str | None, stores: int, inputs: int, outputs: int,
       controllers: int, frontends: int, port: int, netns: bool, zones: str,
       cpu_quota: float | None) -> None:  # fmt: skip
    """Start the cluster in the background; prints the frontend URL."""
    from cherami.cluster.local import LocalCluster
    from cherami.cluster.netns import NetnsCluster

    path = Path(root).resolve()
    if (path / "cluster.json").exists():
        raise click.ClickException(f"a cluster is already up in {path}; run cluster down first")
    counts = {
        "storehost": stores, "controller": controllers, "inputhost": inputs,
        "outputhost": outputs, "frontend": max(1, frontends),
    }  # fmt: skip
    if (zones or cpu_quota) and not netns:
        raise click.ClickException("--zones and --cpu-quota need --netns")
    url = metadata or f"sqlite:///{path}/metadata.db"
    local = (
        NetnsCluster(path, url, counts, port, zones=[z for z in zones.split(",") if z] or None,
                     cpu_quota=cpu_quota, keep=True)
        if netns else LocalCluster(path, url, counts, port)
    )  # fmt: skip
    try:
        local.up()
    except Exception:
        local.down()
        raise
    for name, proc in local.procs.items():
        zone = f"  zone {local.zones[name]}" if isinstance(local, NetnsCluster) else ""
        click.echo(f"{name:14} pid {proc.pid:<8} {proc.address}{zone}")
    click.echo(f"frontend: {local.url}")


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True)
def down(root: str) -> None:
    """Stop the cluster started in --dir (and remove its namespaces, if it has them)."""
    from cherami.cluster.local import down_from_state
    from cherami.cluster.netns import teardown_state

    path = Path(root).resolve()
    if not (path / "cluster.json").exists():
        raise click.ClickException(f"no cluster is up in {path}")
    network = json.loads((path / "cluster.json").read_text()).get("netns")
    try:
        click.echo(f"stopped {down_from_state(path)} processes")
    finally:
        if network:
            teardown_state(network)
            click.echo(f"removed {len(network['hosts'])} network namespaces")
