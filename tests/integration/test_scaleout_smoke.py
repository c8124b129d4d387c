"""A smoke run of benchmarks/scaleout.py (quick mode, one point: 2 input hosts each
capped at 0.1 CPU in network namespaces): it runs to the end, both input hosts carry
load, and it writes its JSON and PNG. No timing is asserted. Needs root, iproute2,
iptables and PostgreSQL, as the benchmark does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(90)
def test_scaleout_quick_publish_with_two_input_hosts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaleout.py"), "--quick", "--roles",
         "publish", "--hosts", "2", "--seconds", "1", "--warmup", "0.5", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=80, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (point,) = json.loads((tmp_path / "scaleout-latest.json").read_text())["points"]
    assert point["role"] == "inputhost" and point["hosts"] == 2
    assert point["msgs_s"] > 0, point
    assert point["errors"] == 0, point
    assert len(point["capped_cpu"]) == 2
    assert all(cpu > 0.02 for cpu in point["capped_cpu"]), point["capped_cpu"]
    assert (tmp_path / "scaleout-latest.png").stat().st_size > 0
    print(f"2 input hosts: {point['msgs_s']:,.0f} msgs/s, capped CPU {point['capped_cpu']}")
