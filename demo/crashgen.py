"""Synthetic crash reports in the spirit of Mozilla's Socorro: a product, a version, a
platform and the signature of the crashing stack. A few are malformed on purpose."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime

from cherami.client.models import OutgoingMessage

SIGNATURES = [
    ("OOM | small", 14),
    ("mozilla::dom::Element::GetAttr", 11),
    ("js::gc::GCRuntime::collect", 9),
    ("IPCError-browser | ShutDownKill", 9),
    ("shutdownhang | nsThread::Shutdown", 7),
    ("nsThread::ProcessNextEvent", 6),
    ("core::option::expect_failed | webrender::renderer::Renderer::render", 5),
    ("EMPTY: no crashing thread identified", 4),
    ("mozilla::net::nsHttpChannel::OnStartRequest", 3),
    ("libxul.so@0x2b4c1d", 2),
]
PRODUCTS = [("Firefox", ["131.0", "131.0.2", "132.0b4"]), ("Fenix", ["131.1.0"]),
            ("Thunderbird", ["128.3.1esr"])]  # fmt: skip
PLATFORMS = ["Windows 10", "Windows 11", "macOS 14.6", "Linux", "Android 14"]
REQUIRED = ("uuid", "product", "version", "platform", "signature", "crash_time")


class CrashReports:
    """Reports from a seeded generator: ``malformed_every``-th report is broken."""

    def __init__(self, seed: int = 7, malformed_every: int = 97) -> None:
        self._random = random.Random(seed)
        self._names = [s for s, _ in SIGNATURES]
        self._weights = [w for _, w in SIGNATURES]
        self.malformed_every = malformed_every
        self.made = self.malformed = 0

    def next(self) -> OutgoingMessage:
        r = self._random
        self.made += 1
        product, versions = r.choice(PRODUCTS)
        report = {
            "uuid": str(uuid.UUID(int=r.getrandbits(128))),
            "product": product,
            "version": r.choice(versions),
            "platform": r.choice(PLATFORMS),
            "signature": r.choices(self._names, self._weights)[0],
            "crash_time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "uptime_seconds": r.randint(1, 86_400),
            "memory_mb": r.randint(180, 16_000),
            "frames": [f"frame{i}" for i in range(r.randint(3, 12))],
        }
        body = json.dumps(report)
        if self.malformed_every and self.made % self.malformed_every == 0:
            self.malformed += 1
            body = body[: len(body) // 2]  # a truncated upload
        return OutgoingMessage(body, {"product": product, "kind": "crash"})


def parse(body: bytes) -> dict[str, object]:
    """A report, or ValueError when it is malformed (the worker's check)."""
    report = json.loads(body)
    if not isinstance(report, dict) or any(k not in report for k in REQUIRED):
        raise ValueError("crash report lacks required fields")
    return report
