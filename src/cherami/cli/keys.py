"""``cherami keys``: API keys for the auth file, stored hashed (docs/api.md, "Auth").

``keys new`` makes a random key and prints it (line 1: give it to the client; it is
not kept anywhere) and its auth-file entry (line 2: only the key's SHA-256). ``keys
hash`` prints the entry of a key you already have (from the argument or stdin)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from cherami.cli.main import cli
from cherami.roles.frontend.auth import hash_key, new_key


def entry_options(command: Any) -> Any:
    for option in reversed([
        click.option("--scope", "scopes", multiple=True, required=True,
                     type=click.Choice(["admin", "produce", "consume"]),
                     help="A scope of the key (repeat for more)."),
        click.option("--prefix", "prefixes", multiple=True,
                     help="A queue-name prefix the key covers (repeat; default every queue)."),
        click.option("--publish-rate", type=float, help="The key's own limit, messages/s."),
        click.option("--publish-bytes-rate", type=float, help="The key's own limit, bytes/s."),
    ]):  # fmt: skip
        command = option(command)
    return command


def entry(key: str, scopes: tuple[str, ...], prefixes: tuple[str, ...],
          publish_rate: float | None, publish_bytes_rate: float | None) -> str:  # fmt: skip
    """The key's auth-file entry, as one line of JSON."""
    fields: dict[str, Any] = {"key_sha256": hash_key(key).hex(), "scopes": list(scopes)}
    if prefixes:
        fields["prefixes"] = list(prefixes)
    if publish_rate:
        fields["publish_rate"] = publish_rate
    if publish_bytes_rate:
        fields["publish_bytes_rate"] = publish_bytes_rate
    return json.dumps(fields)


@cli.group()
def keys() -> None:
    """API keys for --auth-file, stored as their SHA-256."""


@keys.command("new")
@entry_options
def keys_new(**options: Any) -> None:
    """Make a random key: prints the key (line 1) and its auth-file entry (line 2)."""
    key = new_key()
    click.echo(key)
    click.echo(entry(key, **options))


@keys.command("hash")
@click.argument("key", required=False)
@entry_options
def keys_hash(key: str | None, **options: Any) -> None:
    """Print the auth-file entry of KEY (read from stdin when not given)."""
    if key is None:
        key = sys.stdin.readline().strip()
    if not key:
        raise click.BadParameter("an empty key", param_hint="KEY")
    click.echo(entry(key, **options))
