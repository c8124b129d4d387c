"""The ``cherami`` command line."""

from __future__ import annotations

import sys
from typing import Any

import click

from cherami.cli.output import FORMATS, exit_code, flag_names
from cherami.errors import CheramiError


class _Cli(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CheramiError as err:
            click.echo(f"error: {err.code}: {flag_names(err.message)}", err=True)
            sys.exit(exit_code(err))
        except OSError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)


@click.group(cls=_Cli)
@click.version_option(package_name="cherami")
@click.option(
    "--output", "-o", type=click.Choice(FORMATS), default="json", envvar="CHERAMI_OUTPUT",
    show_default=True, help="How answers print: json (for scripts) or table (env CHERAMI_OUTPUT).",
)  # fmt: skip
@click.option("--url", default=None, help="Server URL, for every command (as its own --url).")
@click.option("--api-key", default=None, help="API key, for every command (as its --api-key).")
@click.option("--tls-ca", default=None, help="PEM CA, for every command (as its --tls-ca).")
def cli(output: str, url: str | None, api_key: str | None, tls_ca: str | None) -> None:
    """Cherami: a durable task queue with consumer groups, DLQ and delayed messages."""


@cli.command()
@click.option("--data-dir", help="Directory for RocksDB store hosts and metadata.db.")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port (0 picks a free one and prints it).")
@click.option("--stores", type=int, help="Number of store hosts (default 3).")
@click.option("--auth-file", help="JSON list of API keys with scopes and prefixes.")
@click.option("--allow-remote-without-auth", is_flag=True, default=None,
              help="Listen beyond loopback without API keys (anyone may call).")  # fmt: skip
@click.option(
    "--role",
    type=click.Choice(["frontend", "controller", "inputhost", "outputhost", "storehost"]),
    help="Run one role (a cluster process) instead of every role.",
)
@click.option("--metadata", help="sqlite:///path or postgresql://... (needed with --role).")
@click.option("--advertise", help="HOST:PORT at which other hosts reach this one.")
@click.option("--zone", help="Failure domain of this host; replicas go to distinct zones.")
@click.option(
    "--cluster-secret-file",
    help="File with the cluster's secret (every host the same; a node makes its own).",
)
@click.option("--tls-cert", help="PEM certificate: serve HTTP, WebSocket and store links over TLS.")
@click.option("--tls-key", help="PEM private key of --tls-cert.")
@click.option("--tls-ca", help="PEM CA that internal clients verify peers with (default: system).")
@click.option("--load-report-interval", type=float, help="Seconds between load reports (2).")
@click.option(
    "--scale-up-window", type=float,
    help="Seconds a queue must run above extent_target_rate before an extent opens (10).",
)  # fmt: skip
@click.option(
    "--scale-down-window", type=float,
    help="Seconds a queue must run below half of it before an extent is sealed (60).",
)  # fmt: skip
@click.option(
    "--extent-max-messages", type=int,
    help="Seal an open extent once it holds this many messages (default 1,000,000).",
)  # fmt: skip
@click.option(
    "--metrics-port", type=int,
    help="A store host's /metrics port in a cluster (0: a free one; other roles: the API port).",
)  # fmt: skip
@click.option(
    "--sqs-port", type=int,
    help="Serve the SQS-compatible API on this port too (0: a free one; docs/sqs.md).",
)  # fmt: skip
@click.option("--config", "config_file", help="Config file: JSON, or TOML (name ends .toml).")
@click.option("--log-level", help="DEBUG, INFO (default), WARNING, ERROR or CRITICAL.")
@click.option("--log-format", type=click.Choice(["text", "json"]),
              help="text (default) or json: one JSON object a line.")  # fmt: skip
def serve(config_file: str | None, **args: Any) -> None:
    """Start every role of a node on the embedded default."""
    try:
        from cherami.cli.serve import run_node
    except ModuleNotFoundError as err:  # the client-only install
        raise click.ClickException(
            f"the server needs its extra dependencies ({err.name} is missing): "
            "pip install 'cherami[server]'"
        ) from None
    from cherami.config import load_config

    run_node(load_config(args, config_file))


def main() -> None:
    # import the package module, not ``__main__``: under ``python -m cherami.cli.main``
    # this file runs as a second module whose ``cli`` the commands never see
    from cherami.cli import cluster, clusterstatus, commands, keys, top  # noqa: F401
    from cherami.cli import main as package_main

    package_main.cli()


if __name__ == "__main__":
    main()
