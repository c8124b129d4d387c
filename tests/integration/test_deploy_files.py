"""deploy/grafana/cherami.json and deploy/prometheus/alerts.yml name only series a real
node exports (its /metrics scraped after some traffic), and promtool (Debian's
prometheus package, installed by make sysdeps) accepts the rules."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.server import ServerProcess, unique

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERIES = re.compile(r"\bcherami_[a-z0-9_]+")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}


def exported(server: ServerProcess) -> set[str]:
    """The sample names of the node's /metrics, from its ``# TYPE`` lines (so a
    histogram with no observation yet counts too)."""
    q = unique()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        http.put(f"/v1/queues/{q}")
        http.put(f"/v1/queues/{q}/groups/g")
        http.post(f"/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]})
        text = http.get("/metrics").text
        http.delete(f"/v1/queues/{q}")
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.update(name + suffix for suffix in SUFFIXES[kind])
    return names


def expressions(node: Any) -> list[str]:
    """Every ``expr`` and ``query`` string anywhere in a loaded JSON or YAML document."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            else:
                found += expressions(value)
    elif isinstance(node, list):
        for item in node:
            found += expressions(item)
    return found


def check_series(exprs: list[str], names: set[str]) -> set[str]:
    used: set[str] = set()
    for expr in exprs:
        series = set(SERIES.findall(expr))
        assert series, f"names no cherami series: {expr}"
        unknown = series - names
        assert not unknown, f"{expr}: not exported: {sorted(unknown)}"
        used |= series
    return used


def test_dashboard_and_alerts_name_real_series(server: ServerProcess) -> None:
    names = exported(server)
    assert "cherami_group_oldest_unacked_age_seconds" in names

    dashboard = json.loads((DEPLOY / "grafana" / "cherami.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert all(p["targets"] and p["title"] for p in panels)
    used = check_series(expressions(dashboard), names)
    rows = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert {"Throughput", "Backlog", "Dead-letter queues", "Latency", "Hosts"} <= rows
    for family in ("cherami_group_oldest_unacked_age_seconds", "cherami_group_dlq_messages",
                   "cherami_host_up", "cherami_publish_latency_seconds_bucket",
                   "cherami_store_append_latency_seconds_bucket"):  # fmt: skip
        assert family in used, family

    rules_file = DEPLOY / "prometheus" / "alerts.yml"
    rules = yaml.safe_load(rules_file.read_text())
    alerts = [r for group in rules["groups"] for r in group["rules"]]
    assert all(r["alert"] and r["annotations"]["summary"] for r in alerts)
    used = check_series([r["expr"] for r in alerts], names)
    assert {"cherami_group_oldest_unacked_age_seconds", "cherami_group_dead_lettered_total",
            "cherami_host_up", "cherami_store_append_latency_seconds_bucket"} <= used  # fmt: skip

    checked = subprocess.run(
        ["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts)} rules found" in checked.stdout
