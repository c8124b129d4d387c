"""A total-queue checker in the manner of Jepsen: attempted, acked and delivered messages
in, lost / unexpected / duplicated out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class QueueHistory:
    attempted: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    delivered: Counter[str] = field(default_factory=Counter)

    def report(self) -> dict[str, int]:
        seen = set(self.delivered)
        return {
            "attempted": len(self.attempted),
            "acked": len(self.acked),
            "delivered": len(seen),
            "lost": len(self.acked - seen),
            "unexpected": len(seen - self.attempted),
            "duplicated": sum(1 for n in self.delivered.values() if n > 1),
        }
