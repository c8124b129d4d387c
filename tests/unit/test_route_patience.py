"""How a forward waits for a host to serve a queue or group (frontend/proxy.py
``_patiently``): it looks again after a pause that doubles up to half a second, so a
publish waiting out an extent's replacement reads the metadata store a few times a
second, not ten."""

from __future__ import annotations

import pytest

from cherami.errors import Unavailable
from cherami.roles.frontend.proxy import FIND_AGAIN, ROUTE_PATIENCE, _patiently


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_a_host_found_late_is_looked_for_with_growing_pauses() -> None:
    clock, looks = _Clock(), []

    async def find() -> str | None:
        looks.append(clock.now)
        return "host:1" if clock.now >= 3.0 else None

    assert await _patiently(find, "none", clock, clock.sleep) == "host:1"
    pauses = [b - a for a, b in zip(looks, looks[1:], strict=False)]
    assert pauses[0] == FIND_AGAIN[0] and max(pauses) == FIND_AGAIN[1]
    assert pauses == sorted(pauses)
    assert len(looks) <= 12  # at every 0.1 s: 31


async def test_no_host_within_the_patience_is_unavailable_after_a_few_looks() -> None:
    clock, looks = _Clock(), []

    async def find() -> str | None:
        looks.append(clock.now)
        return None

    with pytest.raises(Unavailable, match="none"):
        await _patiently(find, "none", clock, clock.sleep)
    assert looks[-1] == ROUTE_PATIENCE  # the last look at the deadline, not past it
    assert len(looks) <= 26  # at every 0.1 s: 101
