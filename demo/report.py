"""The demo's closing report: counts that must reconcile."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo.sparkjob import MALFORMED


@dataclass(frozen=True)
class Reconcile:
    published: int
    processed: int  # distinct reports the workers processed
    dead_lettered: int
    duplicates: int  # reports processed more than once (after a redelivery)
    malformed_made: int
    spark_total: int
    spark_malformed: int
    by_signature: list[tuple[str, int]]
    minutes: int
    parquet: Path
    publish_seconds: float = 0.0

    @classmethod
    def of(cls, published: int, processed: int, dead_lettered: int, duplicates: int,
           malformed_made: int, rows: list[Any], parquet: Path) -> Reconcile:  # fmt: skip
        per_signature: Counter[str] = Counter()
        for row in rows:
            per_signature[row.signature] += int(row.crashes)
        return cls(
            published=published, processed=processed, dead_lettered=dead_lettered,
            duplicates=duplicates, malformed_made=malformed_made,
            spark_total=sum(per_signature.values()), spark_malformed=per_signature[MALFORMED],
            by_signature=per_signature.most_common(), minutes=len({r.minute for r in rows}),
            parquet=parquet,
        )  # fmt: skip

    @property
    def workers_reconcile(self) -> bool:
        return self.processed + self.dead_lettered == self.published

    @property
    def spark_reconciles(self) -> bool:
        return self.spark_total == self.published

    @property
    def ok(self) -> bool:
        return self.published > 0 and self.workers_reconcile and self.spark_reconciles


def print_report(r: Reconcile) -> None:
    from rich.console import Console
    from rich.table import Table

    def mark(good: bool) -> str:
        return "[green]✓[/green]" if good else "[red]✗[/red]"

    console = Console()
    counts = Table(title="Crash-report pipeline: reconcile", show_header=False)
    counts.add_column(justify="left")
    counts.add_column(justify="right")
    counts.add_column(justify="left")
    rate = f"in {r.publish_seconds:.1f} s" if r.publish_seconds else ""
    counts.add_row("published", f"{r.published:,}", rate)
    counts.add_row("processed by workers (competing group)", f"{r.processed:,}", "")
    counts.add_row("dead-lettered (malformed, in the DLQ)", f"{r.dead_lettered:,}",
                   f"{r.malformed_made:,} made malformed")  # fmt: skip
    counts.add_row("processed + dead-lettered", f"{r.processed + r.dead_lettered:,}",
                   f"{mark(r.workers_reconcile)} = published")  # fmt: skip
    counts.add_row("processed twice (redeliveries)", f"{r.duplicates:,}", "")
    counts.add_row("Spark total (stream-mode group, Parquet)", f"{r.spark_total:,}",
                   f"{mark(r.spark_reconciles)} = published")  # fmt: skip
    console.print(counts)

    top = Table(title=f"Crashes per signature ({r.minutes} minute(s)) - {r.parquet}")
    top.add_column("signature")
    top.add_column("crashes", justify="right")
    for signature, crashes in r.by_signature[:12]:
        top.add_row(signature, f"{crashes:,}")
    console.print(top)
    verdict = "[green]counts reconcile[/green]" if r.ok else "[red]counts do NOT reconcile[/red]"
    console.print(verdict)
