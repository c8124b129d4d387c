"""The docs agree with the code: every error code the product raises is in docs/api.md's
error table and every code there is raised; every repository path the docs and the
source cite exists."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import cherami.errors as errors_module
from cherami.errors import ERRORS_BY_CODE, CheramiError

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "cherami"
ERROR_CALLS = {"StorageError", "StoreError"}  # their first argument is the code
CODE = re.compile(r"`([a-z_]+)`")


def _table() -> dict[str, set[str]]:
    """docs/api.md's error table: each code with the statuses of the rows naming it
    (``—`` for a code that is not an answer of the HTTP API)."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("## Errors") :]
    section = section[: section.index("\n## ", 1)]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"\d{3}|—", cells[0]):
            continue
        for code in CODE.findall(cells[1]):
            rows.setdefault(code, set()).add(cells[0])
    assert rows, "docs/api.md has no error table"
    return rows


def _raised_codes() -> dict[str, str]:
    """Every error code in src/cherami, with where it is: the ``code`` of each error
    class, the code given to StorageError/StoreError, the code of a store protocol
    ``Failed`` reply, and the code of an error body written by hand."""
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), where)):
            strings: list[ast.expr] = []
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign):
                        target, value = stmt.targets[0], stmt.value
                        if isinstance(target, ast.Name) and target.id == "code":
                            strings.append(value)
                        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                            names = [t.id for t in target.elts if isinstance(t, ast.Name)]
                            if "code" in names:
                                strings.append(value.elts[names.index("code")])
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in ERROR_CALLS and node.args:
                    strings.append(node.args[0])
                elif name == "Failed" and len(node.args) >= 2:
                    strings.append(node.args[1])
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "code":
                        strings.append(value)
            for value in strings:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.setdefault(value.value, f"{where}:{value.lineno}")
    return found


def test_every_error_code_is_in_the_api_docs_and_every_documented_code_is_raised() -> None:
    table = _table()
    raised = _raised_codes()
    assert {"internal", "queue_not_found", "extent_not_found", "sequence_gap"} <= set(raised)
    undocumented = {code: where for code, where in raised.items() if code not in table}
    assert not undocumented, f"codes missing from docs/api.md's error table: {undocumented}"
    unknown = set(table) - set(raised)
    assert not unknown, f"docs/api.md lists codes nothing raises: {sorted(unknown)}"


def test_the_error_table_gives_each_class_its_status() -> None:
    table = _table()
    classes = [
        cls
        for _, cls in inspect.getmembers(errors_module, inspect.isclass)
        if issubclass(cls, CheramiError)
    ]
    for cls in classes:
        statuses = table[cls.code]
        if "—" in statuses:  # not an answer of the HTTP API
            continue
        assert str(cls.status) in statuses, f"{cls.__name__}: {cls.status} not in {statuses}"
    assert set(ERRORS_BY_CODE) <= set(table)


def test_one_root() -> None:
    """The storage layer's and the store client's errors are CheramiErrors too."""
    from cherami.roles.storehost.client import StoreError
    from cherami.storage.base import StorageError

    assert issubclass(StorageError, CheramiError) and issubclass(StoreError, CheramiError)
    refused = StorageError("sequence_gap", "extent e holds 3, append starts 5")
    assert (refused.code, str(refused)) == ("sequence_gap", "extent e holds 3, append starts 5")


# paths: from the repository's root, or (as the docs write them) from src/cherami
ROOTED = ("src", "tests", "benchmarks", "docs", "deploy", "demo")
IN_PACKAGE = ("roles", "storage", "metadata", "cluster", "wire", "client", "cli", "spark")
PATH = re.compile(r"(?<![\w/.$-])((?:" + "|".join(ROOTED + IN_PACKAGE) + r")/[\w./-]*\w)")
LINK = re.compile(r"\]\(([^)#\s]+)")  # a markdown link's target


def _cited(text: str) -> list[str]:
    return [m.group(1) for m in PATH.finditer(text)]


def _missing(base: Path, path: str) -> bool:
    first = path.split("/", 1)[0]
    where = ROOT / path if first in ROOTED else SRC / path
    return not where.exists() and not (base / path).exists()


def test_every_path_the_docs_and_the_source_cite_exists() -> None:
    documents = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    documents += sorted((ROOT / "docs").rglob("*.md"))
    sources = sorted(SRC.rglob("*.py"))
    missing: list[str] = []
    for file in documents + sources:
        text = file.read_text()
        cited = _cited(text)
        if file.suffix == ".md":
            cited += [t for t in LINK.findall(text) if "://" not in t and not t.startswith("/")]
        for path in dict.fromkeys(cited):
            if _missing(file.parent, path):
                missing.append(f"{file.relative_to(ROOT)}: {path}")
    assert not missing, "cited paths that do not exist:\n" + "\n".join(missing)


def test_no_doc_cites_the_shared_notes() -> None:
    """``shared/`` held notes of another repository; nothing here may send a reader there."""
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *SRC.rglob("*.py")]
    citing = [str(f.relative_to(ROOT)) for f in files if "shared/" in f.read_text()]
    assert not citing, citing


def test_the_path_pattern() -> None:
    text = (
        "see `src/cherami/timing.py`, roles/outputhost/outage.py and tests/unit/x.py; "
        "not $URL/docs/x, http://h/docs/y, tests/{unit,contract}, cherami.devcluster.netns, "
        "or DIR/store-N/journal/<n>.log"
    )
    assert _cited(text) == [
        "src/cherami/timing.py",
        "roles/outputhost/outage.py",
        "tests/unit/x.py",
    ]
