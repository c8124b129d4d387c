"""The role processes of a cluster on one SQLite file start at once and each makes the
schema: two that both found a column missing both added it, and the second exited
("duplicate column name"; seen in CI as a store host that never came up). Real
processes on a real file, started together behind a barrier, many times."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from cherami.metadata.sqlite_commit import connect
from cherami.metadata.sqlite_schema import create_schema

PROCESSES, ROUNDS = 6, 20


def _make(path: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    db = connect(path)
    barrier.wait()
    create_schema(db)


def test_processes_making_the_schema_at_once_all_start(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    failed = []
    for n in range(ROUNDS):
        path = str(tmp_path / f"metadata-{n}.db")
        barrier = context.Barrier(PROCESSES)
        procs = [context.Process(target=_make, args=(path, barrier)) for _ in range(PROCESSES)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(30)
        failed += [(n, proc.exitcode) for proc in procs if proc.exitcode != 0]
    assert not failed, failed
