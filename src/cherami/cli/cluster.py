"""``cherami cluster up|down``: a local multi-process cluster on loopback."""

from __future__ import annotations

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
def up(root: str, metadata: str | None, stores: int, inputs: int, outputs: int,
       controllers: int, frontends: int, port: int) -> None:  # fmt: skip
    """Start the cluster in the background; prints the frontend URL."""
    from cherami.cluster.local import LocalCluster

    path = Path(root).resolve()
    if (path / "cluster.json").exists():
        raise click.ClickException(f"a cluster is already up in {path}; run cluster down first")
    counts = {
        "storehost": stores, "controller": controllers, "inputhost": inputs,
        "outputhost": outputs, "frontend": max(1, frontends),
    }  # fmt: skip
    local = LocalCluster(path, metadata or f"sqlite:///{path}/metadata.db", counts, port)
    try:
        local.up()
    except Exception:
        local.down()
        raise
    for name, proc in local.procs.items():
        click.echo(f"{name:14} pid {proc.pid:<8} {proc.address}")
    click.echo(f"frontend: {local.url}")


@cluster.command()
@click.option("--dir", "root", default="./cluster", show_default=True)
def down(root: str) -> None:
    """Stop the cluster started in --dir."""
    from cherami.cluster.local import down_from_state

    path = Path(root).resolve()
    if not (path / "cluster.json").exists():
        raise click.ClickException(f"no cluster is up in {path}")
    click.echo(f"stopped {down_from_state(path)} processes")
