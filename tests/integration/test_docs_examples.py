"""The README's and docs/api.md's examples run as written, in order, on a fresh node.

Which blocks run (the convention the docs follow):

- README.md: every fenced block whose language is ``sh`` or ``python``, in the order of
  the file, as one bash script (``set -eo pipefail``: every command must exit 0), a
  python block run by this interpreter from inside it, so what a shell block exports
  (``CHERAMI_URL``) reaches the blocks after it.
- docs/api.md: every ``$ ...`` command of a fenced block (with its continuation lines),
  in the order of the file, as one bash script, so a variable set by one command is
  seen by the next. A ``$ curl`` command must answer the status on the line after it
  (``200 {...}``, ``HTTP/1.1 429 ...``), or the one its comment names (``# 204``), or
  else a 2xx; any other command must exit 0.
- A block whose fence has the line ``<!-- not run -->`` just before it is not run (an
  example that needs another server set-up: API keys, a rate limit, a second server),
  and neither is a block of any other language (``text``, ``json``, ``toml``): output
  samples, files, commands that start servers.

The one change made to the text: the docs' address, ``http://127.0.0.1:8080``, becomes
the test node's (``$URL`` in api.md is set to it). Both documents run on one node; the
queues the first made are deleted before the second, so each finds the node as fresh.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
DOCS_URL = "http://127.0.0.1:8080"
NOT_RUN = "<!-- not run -->"
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
STATUS = re.compile(r"^(?:HTTP/[\d.]+ )?([1-5]\d\d)\b")
COMMENTED_STATUS = re.compile(r"#\s*([1-5]\d\d)\b")


@dataclass(frozen=True)
class Block:
    language: str
    lines: list[str]  # without the fence's indentation
    line: int  # of the opening fence, 1-based
    run: bool


def blocks(text: str) -> Iterator[Block]:
    """The fenced blocks of a markdown text, in order."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.group(1), opening.group(2)
        before = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
        yield Block(language, body, i + 1, before != NOT_RUN)
        i = j + 1


@dataclass(frozen=True)
class Command:
    text: str  # as written, continuation lines included
    expect: int | None  # the status the doc shows for a curl command (None: any 2xx)
    line: int


def _complete(text: str) -> bool:
    if text.rstrip().endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # an open quote: a JSON body over several lines
        return False
    return True


def commands(block: Block) -> Iterator[Command]:
    """The ``$ `` commands of a block, each with the status shown after it."""
    lines = block.lines
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        start = i
        text = lines[i][2:]
        while not _complete(text) and i + 1 < len(lines):
            i += 1
            text += "\n" + lines[i]
        i += 1
        answer = lines[i].strip() if i < len(lines) else ""
        shown = STATUS.match(answer) or COMMENTED_STATUS.search(text.splitlines()[-1])
        yield Command(text, int(shown.group(1)) if shown else None, block.line + 1 + start)


def readme_script(text: str, url: str) -> str:
    """README.md's sh and python blocks as one bash script."""
    parts = ["set -eo pipefail", "trap 'echo \"failed: $BASH_COMMAND\" >&2' ERR"]
    for block in blocks(text):
        if not block.run or block.language not in ("sh", "python"):
            continue
        code = "\n".join(block.lines).replace(DOCS_URL, url)
        parts.append(f"echo '>>> README.md line {block.line}'")
        if block.language == "sh":
            parts.append(code)
        else:
            parts.append(f"\"$PYTHON\" - <<'CHERAMI_DOCS_EOF'\n{code}\nCHERAMI_DOCS_EOF")
    return "\n".join(parts) + "\n"


def api_script(text: str, out: Path) -> tuple[str, list[Command]]:
    """docs/api.md's commands as one bash script: curl's status and body of command N go
    to ``out/N.status`` and ``out/N.body``, any other command's exit code to
    ``out/N.status``."""
    parts: list[str] = []
    run: list[Command] = []
    for block in blocks(text):
        if not block.run:
            continue
        for command in commands(block):
            n = len(run)
            run.append(command)
            if command.text.startswith("curl "):
                wrapped = (
                    f"command curl -sS -o '{out}/{n}.body' -w '%{{http_code}}' "
                    + command.text[len("curl ") :]
                )
                parts.append(f"{{\n{wrapped}\n}} > '{out}/{n}.status'")
            else:
                parts.append(f"{command.text}\necho $? > '{out}/{n}.status'")
    return "\n".join(parts) + "\n", run


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("docs-node")).start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh(node: ServerProcess) -> ServerProcess:
    """The node with no queue left from an earlier document."""
    with httpx.Client(base_url=node.url, timeout=10) as http:
        for queue in http.get("/v1/queues").json()["queues"]:
            assert http.delete(f"/v1/queues/{queue['name']}").status_code == 204
        assert http.get("/v1/queues").json()["queues"] == []
    return node


def _needs(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"the docs' examples use {', '.join(missing)}: make sysdeps installs them")


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = sys.executable
    return {**env, **extra}


def test_readme_examples_run_in_order(fresh: ServerProcess, tmp_path: Path) -> None:
    _needs("jq")
    script = readme_script((ROOT / "README.md").read_text(), fresh.url)
    assert "cherami queue create" in script and "Client(" in script, "no examples found"
    result = _bash(script, tmp_path, _env())
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_api_examples_run_in_order(fresh: ServerProcess, tmp_path: Path) -> None:
    _needs("curl", "jq")
    out = tmp_path / "out"
    out.mkdir()
    script, run = api_script((ROOT / "docs" / "api.md").read_text(), out)
    assert len(run) > 20, "no examples found"
    result = _bash(script, tmp_path, _env(URL=fresh.url))
    failures = []
    for n, command in enumerate(run):
        status_file = out / f"{n}.status"
        got = status_file.read_text().strip() if status_file.exists() else "not run"
        if command.text.startswith("curl "):
            ok = got == str(command.expect) if command.expect else got.startswith("2")
            want = command.expect or "2xx"
        else:
            ok, want = got == "0", "exit 0"
        if not ok:
            body_file = out / f"{n}.body"
            body = body_file.read_text()[:300] if body_file.exists() else ""
            failures.append(f"api.md line {command.line}: {command.text!r}: {got}, not {want}"
                            f" {body}")  # fmt: skip
    assert not failures, "\n".join(failures) + "\n" + result.stderr[-2000:]


def test_the_block_convention() -> None:
    """How blocks and commands are read: a marked block is skipped, continuation lines
    and multi-line bodies belong to their command, a shown status is expected."""
    text = "\n".join([
        "```sh", "echo one", "```",
        NOT_RUN, "```sh", "echo skipped", "```",
        "```text", "make run", "```",
        "  ```",
        "  $ curl -X POST $URL/q -d '{\"a\":[", "      1]}'",
        "  201 {}",
        "  $ curl $URL/x \\", "      -H 'A: b'      # 204: gone",
        "  $ curl $URL/y",
        "  {\"no\": \"status\"}",
        "  ```",
    ])  # fmt: skip
    found = list(blocks(text))
    assert [(b.language, b.run) for b in found] == [
        ("sh", True), ("sh", False), ("text", True), ("", True)
    ]  # fmt: skip
    assert readme_script(text, "u").count("echo ") == 3  # the sh block, and a marker each
    assert "skipped" not in readme_script(text, "u") and "make run" not in readme_script(text, "u")
    cmds = list(commands(found[3]))
    assert [c.expect for c in cmds] == [201, 204, None]
    assert cmds[0].text == "curl -X POST $URL/q -d '{\"a\":[\n    1]}'"
    assert cmds[1].text.endswith("# 204: gone")
