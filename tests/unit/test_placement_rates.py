"""Placement by load reads each host's messages/s in once a report: a store host's
report names every extent written since its last (hundreds while queues are being
made), and summing it for every host at every extent opened was 2% of a node's CPU."""

from __future__ import annotations

from cherami.metadata.models import ExtentLoad, Host, LoadReport
from cherami.roles.controller.placement import Placements, pick_stores


class _Counted(LoadReport):
    sums = 0

    def msgs_in(self) -> float:
        _Counted.sums += 1
        return super().msgs_in()


def _host(id_: str, rate: float) -> Host:
    extents = {f"e{i}": ExtentLoad(msgs_in=rate / 500) for i in range(500)}
    return Host(id=id_, role="storehost", address="", heartbeat_at=0.0,
                load=_Counted(at=1.0, extents=extents))  # fmt: skip


def test_a_report_is_summed_once_and_the_busiest_host_is_left_out() -> None:
    placed = Placements(clock=lambda: 0.0)  # placements before every report: none pending
    hosts = [_host("busy", 900.0), _host("s1", 10.0), _host("s2", 20.0)]
    _Counted.sums = 0
    for _ in range(50):
        assert sorted(pick_stores(hosts, 2, placed)) == ["s1", "s2"]
    assert _Counted.sums == 3  # one a host, not 150
    hosts[0] = _host("busy", 5.0)  # its next report: summed again
    assert "busy" in pick_stores(hosts, 2, placed)
    assert _Counted.sums == 4
