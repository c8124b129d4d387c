"""The package layers (issue 28), read from the source: the roles meet only through
their client modules, and the layers import downwards only (cli, server, roles, the
shared modules), with the dev clusters outside the server's import graph."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ROLES = ("controller", "frontend", "inputhost", "outputhost", "storehost")
# what one role may import of another: its client (a store host's client side also has
# its directory of store hosts, which every role uses to reach them)
CLIENT_MODULES = {"client", "directory"}


def _imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every import in src/cherami."""
    found = []
    for path in sorted((SRC / "cherami").rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                found += [(module, name, node.lineno) for name in names]
            elif isinstance(node, ast.Import):
                found += [(module, a.name, node.lineno) for a in node.names]
    return found


def _role(module: str) -> tuple[str, str] | None:
    """(role, its submodule) of a module under cherami.roles."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["cherami", "roles"] and parts[2] in ROLES:
        return parts[2], parts[3] if len(parts) > 3 else ""
    return None


def test_roles_reach_each_other_only_through_their_clients() -> None:
    wrong = []
    for importer, imported, line in _imports():
        mine, theirs = _role(importer), _role(imported)
        if mine is None or theirs is None or mine[0] == theirs[0]:
            continue
        if theirs[1] and theirs[1] not in CLIENT_MODULES:
            wrong.append(f"{importer}:{line} imports {imported}")
    assert not wrong, "a role imports another role's insides:\n" + "\n".join(sorted(set(wrong)))


def _layer(module: str) -> int | None:
    """Higher layers may import lower ones, never the other way round."""
    if module.startswith("cherami.cli"):
        return 4
    if module.startswith("cherami.devcluster"):
        return 4  # beside the CLI: it runs servers as processes, none imports it
    if module.startswith("cherami.server"):
        return 3
    if module.startswith("cherami.roles"):
        return 2
    if module.startswith(("cherami.membership", "cherami.loadmeter", "cherami.httpbase")):
        return 1
    return None


def test_layers_import_downwards_only() -> None:
    wrong = []
    for importer, imported, line in _imports():
        a, b = _layer(importer), _layer(imported)
        if a is not None and b is not None and b > a:
            wrong.append(f"{importer}:{line} imports {imported}")
        if not importer.startswith(("cherami.cli", "cherami.devcluster")) and (
            imported.startswith("cherami.devcluster")
        ):
            wrong.append(f"{importer}:{line} imports the dev clusters ({imported})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(set(wrong)))


def _package(module: str) -> str:
    """The unit of the cycle check: a role, or a top-level package or module."""
    parts = module.split(".")
    if parts[:2] == ["cherami", "roles"] and len(parts) > 2:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def test_no_package_cycle() -> None:
    known = {_package(m) for m, _, _ in _imports()}
    edges: dict[str, set[str]] = {}
    for importer, imported, _ in _imports():
        a, b = _package(importer), _package(imported)
        if a != b and b in known:
            edges.setdefault(a, set()).add(b)
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(known):
        if start not in state:
            visit(start, [start])
    assert not cycles, "package cycles:\n" + "\n".join(cycles)


def test_no_module_is_over_500_lines() -> None:
    """A module that outgrows 500 lines is split by concern (issue 28); two had crept
    back over it unnoticed, since nothing checked."""
    long = {
        str(path.relative_to(SRC)): n
        for path in sorted((SRC / "cherami").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
