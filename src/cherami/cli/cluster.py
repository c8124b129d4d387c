"""``cherami cluster up|down``: a local multi-process cluster on loopback, or with
``--netns`` each process on a host of its own (a Linux network namespace), whose links
``cluster cut|isolate|heal`` drop and restore."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cherami.cli.main import cli

if TYPE_CHECKING:
    from collections.abc import Callable

    from cherami.devcluster.netns import Network


@cli.group()
def cluster() -> None:
    """Run every role as its own process on this machine (loopback)."""


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True, help="State, data and logs.")
@click.option("--metadata", help="postgresql://... or sqlite:///path (default: SQLite in --dir).")
@click.option("--stores", default=3, show_default=True, help="Store host processes.")
@click.option("--inputs", default=2, show_default=True, help="Input host processes.")
@click.option("--outputs", default=2, show_default=True, help="Output host processes.")
@click.option("--controllers", default=2, show_default=True, help="Controller processes.")
@click.option("--frontends", default=1, show_default=True, help="Frontend processes.")
@click.option("--port", default=8080, show_default=True, help="Port of the first frontend.")
@click.option("--netns", is_flag=True, help="Each process in a network namespace (root).")
@click.option("--zones", default="", help="With --netns: zone names (a,b,c), dealt in turn.")
@click.option("--cpu-quota", type=float, help="With --netns: CPUs per host (0.1 = 10%).")
def up(root: str, metadata: str | None, stores: int, inputs: int, outputs: int,
       controllers: int, frontends: int, port: int, netns: bool, zones: str,
       cpu_quota: float | None) -> None:  # fmt: skip
    """Start the cluster in the background; prints the frontend URL."""
    from cherami.devcluster.local import LocalCluster
    from cherami.devcluster.netns import NetnsCluster

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


def _network(root: str) -> Network:
    from cherami.devcluster.netns import Network

    path = Path(root).resolve() / "cluster.json"
    if not path.exists():
        raise click.ClickException(f"no cluster is up in {path.parent}")
    state = json.loads(path.read_text()).get("netns")
    if not state:
        raise click.ClickException("this cluster was not started with --netns")
    return Network.attach(state)


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True,
              help="The cluster's directory (as given to cluster up).")  # fmt: skip
@click.argument("side_a")
@click.argument("side_b")
def cut(root: str, side_a: str, side_b: str) -> None:
    """Drop all traffic between SIDE_A and SIDE_B (--netns clusters): host names
    (storehost-0), zones, or "root" (this machine's namespace: its clients, and a
    metadata store on it)."""
    _on_network(root, lambda network: network.cut(side_a, side_b))
    click.echo(f"cut {side_a} from {side_b}")


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True,
              help="The cluster's directory (as given to cluster up).")  # fmt: skip
@click.argument("zone")
def isolate(root: str, zone: str) -> None:
    """Cut a zone (or a host) off from every other host and from this machine."""
    _on_network(root, lambda network: network.isolate(zone))
    click.echo(f"isolated {zone}")


def _on_network(root: str, change: Callable[[Network], object]) -> None:
    """Apply a cut to a --netns cluster's network; an unknown host or zone is a one-line
    error."""
    network = _network(root)
    try:
        change(network)
    except KeyError as err:
        raise click.ClickException(str(err)) from err


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True,
              help="The cluster's directory (as given to cluster up).")  # fmt: skip
def heal(root: str) -> None:
    """Undo every cut (--netns clusters)."""
    _network(root).heal(everywhere=True)
    click.echo("healed")


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True,
              help="The cluster's directory (as given to cluster up).")  # fmt: skip
def down(root: str) -> None:
    """Stop the cluster started in --dir (and remove its namespaces, if it has them)."""
    from cherami.devcluster.local import down_from_state
    from cherami.devcluster.netns import teardown_state

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
