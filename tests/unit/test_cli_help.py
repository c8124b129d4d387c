"""Every option of every CLI command says what it does, and a server's validation
message names the flag, not the wire field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click

from cherami.cli import cluster, clusterstatus, commands, keys, top  # noqa: F401 (registers)
from cherami.cli.main import cli
from cherami.cli.output import flag_names


def options_without_help(command: click.Command, path: str) -> list[str]:
    missing = [
        f"{path} {p.opts[0]}"
        for p in command.params
        if isinstance(p, click.Option) and not p.help and p.name not in ("help", "version")
    ]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            missing += options_without_help(sub, f"{path} {name}")
    return missing


def test_every_option_has_help() -> None:
    assert options_without_help(cli, "cherami") == []
    assert {"update", "create", "show", "list", "delete"} <= set(cli.commands["queue"].commands)  # type: ignore[attr-defined]
    assert "update" in cli.commands["group"].commands  # type: ignore[attr-defined]


def test_errors_name_flags() -> None:
    assert flag_names("Expected `float` >= 1 - at `$.retention_seconds`") == (
        "Expected `float` >= 1 - at --retention-seconds"
    )
    assert flag_names("at `$.visibility_timeout_seconds`") == "at --visibility-timeout"
    assert flag_names("at `$.messages[0].body`") == "at `$.messages[0].body`"


def test_shell_completion() -> None:
    """README "Shell completion": click's completion of the cherami command."""
    env = {**os.environ, "_CHERAMI_COMPLETE": "bash_complete", "COMP_WORDS": "cherami queue up",
           "COMP_CWORD": "2"}  # fmt: skip
    command = str(Path(sys.executable).with_name("cherami"))  # the installed entry point
    done = subprocess.run([command], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["plain,update"]
