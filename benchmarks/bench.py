"""Run the benchmark workloads against every available system and print one table per workload.

    python benchmarks/bench.py [--quick] [--only rabbitmq,nats] [--workloads fanout,nack]
                               [--baseline NAME] [--no-uvloop]

Results go to benchmarks/results/<timestamp>.json and .png, copied to latest.json / latest.png.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import Driver, Workload, run_workload  # noqa: E402

WORKLOADS_DIR = HERE / "workloads"
RESULTS_DIR = HERE / "results"

DriverFactory = Callable[[], Driver]


def peer(module: str, **opts: Any) -> DriverFactory:
    """Factory that imports ``module`` only when the driver is used and calls its
    ``make_driver(**opts)``; a missing client library then skips one driver, nothing else."""

    def factory() -> Driver:
        return importlib.import_module(module).make_driver(**opts)  # type: ignore[no-any-return]

    return factory


# The registry. Key = name used by --only / --baseline; value = zero-argument callable
# returning a Driver (harness.Driver). A driver may also define `async def start()` and
# `async def stop()` (e.g. to run its own server); they are called around its runs.
DRIVERS: dict[str, DriverFactory] = {
    "cherami-stream": peer("peers.cherami", mode="stream"),
    "cherami-http": peer("peers.cherami", mode="http"),
    "rabbitmq": peer("peers.rabbitmq"),
    "nats": peer("peers.nats"),
    "redis": peer("peers.redis"),
    "redis-aof": peer("peers.redis_aof"),
}


# --------------------------------------------------------------------------- workloads


def load_workloads(quick: bool, names: list[str] | None) -> list[Workload]:
    loaded: list[tuple[int, Workload]] = []
    for path in sorted(WORKLOADS_DIR.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        overrides = raw.pop("quick", None) or {}
        order = int(raw.pop("order", 100))
        if quick:
            raw.update(overrides)
            if "duration_seconds" in overrides:
                raw.pop("messages", None)
            if "messages" in overrides:
                raw.pop("duration_seconds", None)
        wl = Workload.from_mapping(raw)
        if names is None or wl.name in names or path.stem in names:
            loaded.append((order, wl))
    if names:
        unknown = set(names) - {wl.name for _, wl in loaded}
        if unknown:
            raise SystemExit(f"unknown workload(s): {', '.join(sorted(unknown))}")
    return [wl for _, wl in sorted(loaded, key=lambda item: (item[0], item[1].name))]


# --------------------------------------------------------------------------- running


async def run_driver(key: str, workloads: list[Workload], pause_s: float) -> list[dict[str, Any]]:
    """All workloads for one driver; returns [] (after saying why) if it cannot run."""
    try:
        driver = DRIVERS[key]()
    except Exception as exc:  # noqa: BLE001 - a broken driver skips, the others still run
        print(f"[skip] {key}: cannot create driver: {exc!r}", flush=True)
        return []
    start, stop = getattr(driver, "start", None), getattr(driver, "stop", None)
    try:
        if start is not None:
            await start()
        reason = await driver.available()
        if reason is not None:
            print(f"[skip] {driver.name}: {reason}", flush=True)
            return []
        return [await _run_one(key, driver, wl, pause_s) for wl in workloads]
    except Exception as exc:  # noqa: BLE001
        print(f"[skip] {key}: {exc!r}", flush=True)
        return []
    finally:
        if stop is not None:
            await stop()


async def _run_one(key: str, driver: Driver, wl: Workload, pause_s: float) -> dict[str, Any]:
    print(f"[run ] {driver.name:<16} {wl.name:<15}", end=" ", flush=True)
    # Write back what earlier runs left dirty in the page cache, so that no run's fsyncs
    # queue behind another system's write-back.
    await asyncio.to_thread(os.sync)
    result = await run_workload(driver, wl)
    result["key"] = key
    print(_progress_line(result), flush=True)
    await asyncio.sleep(pause_s)  # let the server settle (queue deletion, GC) between runs
    return result


def _progress_line(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"
    return (
        f"pub {_num(r.get('publish_msgs_s'))}/s  consume {_num(r.get('consume_msgs_s'))}/s  "
        f"{_status(r)}  ({r.get('wall_seconds')} s wall, CPU s server "
        f"{r.get('server_cpu_seconds')} / client {r.get('client_cpu_seconds')})"
    )


# --------------------------------------------------------------------------- formatting


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ms(lat: dict[str, float | None] | None, keys: tuple[str, ...]) -> str:
    if not lat:
        return "-"
    return " / ".join("-" if lat.get(k) is None else f"{lat[k]:.1f}" for k in keys)


def _status(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"
    parts: list[str] = []
    if r.get("error"):
        parts.append(f"ERROR {r['error']}")
    if r.get("timed_out"):
        parts.append(f"INCOMPLETE (timeout {r['params']['timeout_seconds']} s)")
    missing = sum(g["missing"] for g in r.get("groups", []))
    dups = sum(g["duplicates"] for g in r.get("groups", []))
    if missing:
        parts.append(f"missing {missing:,}")
    if dups:
        parts.append(f"{dups:,} duplicates")
    return "; ".join(parts) or "ok"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


COLUMNS = (
    "system",
    "durability",
    "publish msgs/s",
    "consume+ack msgs/s",
    "pub p50/p99/p99.9 ms",
    "e2e p50/p99 ms",
    "peak server RSS MiB",
    "vs baseline pub / cons",
    "status",
)


def table_rows(results: list[dict[str, Any]], baseline: str | None) -> list[list[str]]:
    base = next((r for r in results if baseline in (r.get("key"), r["system"])), None)
    rows = []
    for r in results:
        ratio = "-"
        if base is not None:
            ratio = (
                f"{_ratio(r.get('publish_msgs_s'), base.get('publish_msgs_s'))} / "
                f"{_ratio(r.get('consume_msgs_s'), base.get('consume_msgs_s'))}"
            )
        rows.append(
            [
                r["system"],
                r["durability"],
                _num(r.get("publish_msgs_s")),
                _num(r.get("consume_msgs_s")),
                _ms(r.get("publish_latency_ms"), ("p50", "p99", "p99.9")),
                _ms(r.get("e2e_latency_ms"), ("p50", "p99")),
                "-" if r.get("peak_rss_mib") is None else f"{r['peak_rss_mib']:,.0f}",
                ratio,
                _status(r),
            ]
        )
    return rows


def print_tables(
    workloads: list[Workload], results: list[dict[str, Any]], baseline: str | None
) -> None:
    for wl in workloads:
        rows = table_rows([r for r in results if r["workload"] == wl.name], baseline)
        if not rows:
            continue
        size = f"{wl.messages:,} msgs" if wl.messages is not None else f"{wl.duration_seconds:g} s"
        title = f"{wl.name} [{size}]: {wl.description}"
        title += f" (ratios vs {baseline})" if baseline else ""
        _print_table(title, rows)


def _print_table(title: str, rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(f"\n{title}")
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
        for line in [list(COLUMNS), *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
        return
    table = Table(title=title, title_justify="left", show_lines=True)
    for i, column in enumerate(COLUMNS):
        numeric = 2 <= i <= 6
        table.add_column(
            column,
            justify="right" if numeric else "left",
            max_width=52 if column == "durability" else None,
        )
    for row in rows:
        table.add_row(*row)
    Console(width=max(shutil.get_terminal_size((200, 40)).columns, 200)).print(table)


# --------------------------------------------------------------------------- saving


def save_results(
    stamp: str, meta: dict[str, Any], results: list[dict[str, Any]], workloads: list[Workload]
) -> Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{stamp}.json"
    path.write_text(json.dumps({**meta, "results": results}, indent=2))
    shutil.copyfile(path, RESULTS_DIR / "latest.json")
    png = RESULTS_DIR / f"{stamp}.png"
    if plot_throughput(results, workloads, png):
        shutil.copyfile(png, RESULTS_DIR / "latest.png")
    return path


def plot_throughput(results: list[dict[str, Any]], workloads: list[Workload], out: Path) -> bool:
    """Grouped bars (publish, consume+ack) per system, one panel per workload, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [
        wl
        for wl in workloads
        if any(r["workload"] == wl.name and not r.get("skipped") for r in results)
    ]
    if not shown:
        return False
    fig, axes = plt.subplots(
        1, len(shown), figsize=(max(3.6 * len(shown), 6.0), 4.4), squeeze=False
    )
    for ax, wl in zip(axes[0], shown, strict=True):
        _plot_workload(
            ax, wl.name, [r for r in results if r["workload"] == wl.name and not r.get("skipped")]
        )
    axes[0][0].set_ylabel("messages / s (log scale)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8)
    fig.suptitle("Measured throughput (consume+ack is per consumer group)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def _plot_workload(ax: Any, name: str, results: list[dict[str, Any]]) -> None:
    xs = list(range(len(results)))
    width = 0.38
    for offset, key, label in (
        (-width / 2, "publish_msgs_s", "publish"),
        (width / 2, "consume_msgs_s", "consume+ack"),
    ):
        values = [r.get(key) or 0 for r in results]
        bars = ax.bar([x + offset for x in xs], values, width, label=label)
        ax.bar_label(bars, labels=[_short(v) for v in values], fontsize=6, padding=1)
    ax.set_yscale("log")
    ax.set_ylim(
        bottom=100,
        top=max(
            [
                100.0,
                *(r.get("publish_msgs_s") or 0 for r in results),
                *(r.get("consume_msgs_s") or 0 for r in results),
            ]
        )
        * 2.5,
    )
    ax.set_xticks(xs)
    ax.set_xticklabels([r["system"] for r in results], rotation=20, ha="right", fontsize=7)
    ax.set_title(name, fontsize=9)
    for x, r in zip(xs, results, strict=True):
        if not r.get("complete"):
            ax.annotate(
                "incomplete",
                (x, 0.02),
                xycoords=("data", "axes fraction"),
                ha="center",
                fontsize=7,
                color="red",
            )


def _short(value: float) -> str:
    if not value:
        return ""
    return f"{value / 1000:.0f}k" if value >= 10_000 else f"{value / 1000:.1f}k"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="use each workload's quick counts")
    parser.add_argument("--only", help="comma-separated driver keys (default: all registered)")
    parser.add_argument("--workloads", help="comma-separated workload names (default: all)")
    parser.add_argument(
        "--baseline",
        help="driver key or name for the ratio columns "
        "(default: cherami-stream if selected, else none)",
    )
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between runs")
    parser.add_argument("--no-uvloop", action="store_true", help="use the stock asyncio loop")
    return parser.parse_args(argv)


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def select_drivers(only: list[str] | None) -> list[str]:
    if only is None:
        return list(DRIVERS)
    unknown = [k for k in only if k not in DRIVERS]
    if unknown:
        raise SystemExit(f"unknown driver(s): {', '.join(unknown)}; known: {', '.join(DRIVERS)}")
    return only


async def main_async(args: argparse.Namespace) -> int:
    workloads = load_workloads(args.quick, _split(args.workloads))
    keys = select_drivers(_split(args.only))
    baseline = args.baseline or ("cherami-stream" if "cherami-stream" in keys else None)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    meta = {
        "started": stamp,
        "quick": args.quick,
        "drivers": keys,
        "baseline": baseline,
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "workloads": [asdict(wl) for wl in workloads],
    }
    results: list[dict[str, Any]] = []
    for key in keys:
        results.extend(await run_driver(key, workloads, args.pause))
    if results:  # saved before printing, so a closed stdout cannot lose them
        saved = save_results(stamp, meta, results, workloads)
    print_tables(workloads, results, baseline)
    if results:
        print(f"\nresults: {saved} (+ .png, latest.json, latest.png)")
    return 0 if results and all(r.get("complete") or r.get("skipped") for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_uvloop:
        try:
            import uvloop

            return uvloop.run(main_async(args))
        except ImportError:
            pass
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
