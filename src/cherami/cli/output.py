"""How the CLI prints an answer: ``--output json`` (the default: the server's JSON,
indented) or ``--output table`` (rich tables for people), and its exit codes."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cherami.errors import (
    AlreadyExists,
    CheramiError,
    ConfigError,
    Forbidden,
    NotFound,
    Throttled,
    Unauthorized,
    Unavailable,
)

FORMATS = ("json", "table")
# documented in docs/client.md ("The CLI"); click's usage errors are 2
EXIT_CODES: tuple[tuple[type[CheramiError], int], ...] = (
    (ConfigError, 2),
    (NotFound, 3),
    (AlreadyExists, 4),
    (Unavailable, 5),
    (Throttled, 5),
    (Unauthorized, 6),
    (Forbidden, 6),
)


# wire fields whose flag is not the field's name with dashes
FLAGS = {"visibility_timeout_seconds": "--visibility-timeout"}
_FIELD = re.compile(r"`\$\.([a-z_]+)`")


def flag_names(message: str) -> str:
    """A server's validation message with the flag for each field it names:
    "... - at `$.retention_seconds`" -> "... - at --retention-seconds"."""
    return _FIELD.sub(lambda m: FLAGS.get(m[1], "--" + m[1].replace("_", "-")), message)


def exit_code(err: CheramiError) -> int:
    return next((code for kind, code in EXIT_CODES if isinstance(err, kind)), 1)


def output_format() -> str:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    return str(root.params.get("output") or "json") if root else "json"


def emit(value: Any) -> None:
    """Print an answer in the format asked for on the command line."""
    if output_format() != "table":
        click.echo(json.dumps(value, indent=2, ensure_ascii=False))
        return
    console = _console()
    for table in tables(value):
        console.print(table)


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # piped: wide rows, never folded to 80 columns
        console = Console(highlight=False, width=240)
    return console


class Listing:
    """Prints a list as its items arrive, a page of a listing at a time: the JSON
    array ``emit`` prints for the whole list, written an item at a time, or a table of
    each ``page_size`` items, the first with the header. Nothing is printed before the
    first item or ``end``, so an error on the first page prints only the error; one on
    a later page leaves the JSON array unclosed (and the exit code says so)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.table = output_format() == "table"
        self.printed = 0
        self.rows: list[dict[str, Any]] = []

    def add(self, item: dict[str, Any]) -> None:
        if self.table:
            self.rows.append(item)
            if len(self.rows) >= self.page_size:
                self._table()
            return
        text = textwrap.indent(json.dumps(item, indent=2, ensure_ascii=False), "  ")
        click.echo(("[\n" if not self.printed else ",\n") + text, nl=False)
        self.printed += 1

    def end(self) -> None:
        if not self.table:
            click.echo("\n]" if self.printed else "[]")
        elif self.rows or not self.printed:
            self._table()

    def _table(self) -> None:
        console = _console()
        for table in tables(self.rows):
            table.show_header = not self.printed
            console.print(table)
        self.printed += len(self.rows)
        self.rows = []


def tables(value: Any, title: str | None = None) -> list[Table]:
    """A list of objects: one row each. An object: its fields (nested ones dotted) as
    rows of FIELD/VALUE, and a table for each list of objects it holds."""
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        rows = [_flat(v) for v in value]
        columns = list(dict.fromkeys(k for row in rows for k in row))
        table = Table(title=title, title_justify="left", header_style="bold")
        for column in columns:
            table.add_column(column.upper(), overflow="fold")
        for row in rows:
            table.add_row(*(_cell(row.get(c)) for c in columns))
        return [table]
    if not isinstance(value, dict):
        table = Table(show_header=False, title=title)
        table.add_row(_cell(value))
        return [table]
    fields = Table(title=title, title_justify="left", header_style="bold")
    fields.add_column("FIELD")
    fields.add_column("VALUE", overflow="fold")
    nested: list[Table] = []
    for key, item in _flat(value).items():
        if isinstance(item, list) and item and all(isinstance(v, dict) for v in item):
            nested += tables(item, key)
        else:
            fields.add_row(key, _cell(item))
    return ([fields] if fields.row_count else []) + nested


def _flat(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict) and item:
            out.update(_flat(item, f"{prefix}{key}."))
        else:
            out[prefix + key] = item
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() else f"{value:,.3f}".rstrip("0")
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
