"""``cherami top`` against a real node, with a bounded refresh count: its tables show the
queue's publish rate while messages arrive, and each group's backlog, in flight, oldest
unacked age and DLQ depth."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from tests.support.server import ServerProcess, unique


def test_top_shows_rates_backlog_and_age(server: ServerProcess) -> None:
    q = unique("top")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        http.put(f"/v1/queues/{q}")
        http.put(f"/v1/queues/{q}/groups/billing")
        http.put(f"/v1/queues/{q}/groups/audit")
        batch = {"messages": [{"body": f"m{i}"} for i in range(5)]}
        http.post(f"/v1/queues/{q}/messages", json=batch)
        held: list[object] = []
        while len(held) < 2:  # two in flight for billing, held while top runs
            ask = {"max_messages": 2 - len(held), "wait_seconds": 5}
            held += http.post(f"/v1/queues/{q}/groups/billing/receive", json=ask).json()["messages"]
        top = subprocess.Popen(
            [sys.executable, "-m", "cherami.cli.main", "top", "--url", server.url,
             "--queue", q, "--count", "3", "--interval", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert top.stdout is not None
        lines = [top.stdout.readline()]
        while not lines[-1].startswith("└"):  # the end of the first table
            assert lines[-1], "top ended before its first table"
            lines.append(top.stdout.readline())
        deadline = time.monotonic() + 1.5  # published while top refreshes: a rate
        while time.monotonic() < deadline:
            http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "more"}]})
            time.sleep(0.1)
        out, err = top.communicate(timeout=30)
        out = "".join(lines) + out
    assert top.returncode == 0, err
    frames = out.split("cherami top")[1:]
    assert len(frames) == 3, out
    assert all(f"{server.url}" in f and "1 queues" in f for f in frames)
    first, last = (dict(rows(f, q)) for f in (frames[0], frames[-1]))
    # the first refresh has nothing to take a rate against
    assert first[q][0] == "-"
    assert first["billing"][3:7] == ["5", "2", first["billing"][5], "0"]
    assert first["billing"][5].endswith("s") and float(first["billing"][5][:-1]) > 0
    assert first["audit"][3:5] == ["5", "0"] and first["audit"][6] == "0"
    # messages arrived meanwhile: the publish rate is a number, and the backlog grew
    published = last[q][0]
    assert published.endswith("/s") and float(published[:-2].replace(",", "")) > 0, last
    assert int(last["audit"][3]) > 5


def rows(frame: str, queue: str) -> list[tuple[str, list[str]]]:
    """(queue or group name, its cells) for each row of one printed table."""
    found = []
    for line in frame.splitlines():
        line = line.strip()
        if not line.startswith("│"):
            continue  # the title, the header, the borders
        cells = [c.strip() for c in line[1:-1].split("│")]
        if cells[0] == queue:
            found.append((queue, cells[2:]))
        elif len(cells) > 1 and cells[0] == "" and cells[1] in ("billing", "audit"):
            found.append((cells[1], cells[2:]))
    return found
