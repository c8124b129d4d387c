"""Placement's suspects: the store hosts of extents that failed while every host was
alive (an input host cannot reach one of them) go after all others."""

from __future__ import annotations

from cherami.metadata.models import Host
from cherami.roles.controller.placement import Placements, pick_stores


def _stores() -> list[Host]:
    zones = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c"}
    return [Host(id=i, role="storehost", address="", heartbeat_at=0.0, zone=z)
            for i, z in zones.items()]  # fmt: skip


def test_no_suspects_until_a_host_is_in_more_failed_extents_than_another() -> None:
    placed = Placements(clock=lambda: 100.0)
    hosts = _stores()
    placed.failed("e1", ["a1", "b1", "c1"])
    assert placed.suspects(hosts) == set()  # one failure: could be anyone's
    placed.failed("e1", ["a1", "b1", "c1"])  # the same extent again counts once
    assert placed.suspects(hosts) == set()
    placed.failed("e2", ["a2", "b2", "c1"])
    assert placed.suspects(hosts) == {"c1"}


def test_a_suspect_gets_no_replica_while_others_can_take_them() -> None:
    placed = Placements(clock=lambda: 100.0)
    hosts = _stores()
    assert "c1" in pick_stores(hosts, 3, placed)  # zones first: c1 is zone c's only host
    placed.failed("e1", ["a1", "b1", "c1"])
    placed.failed("e2", ["a2", "b2", "c1"])
    for _ in range(20):
        chosen = pick_stores(hosts, 3, placed)
        assert "c1" not in chosen and len(chosen) == 3, chosen
    assert "c1" in pick_stores(hosts, 5, placed)  # still used when every host is needed


def test_suspicion_ends_after_the_window() -> None:
    now = [100.0]
    placed = Placements(clock=lambda: now[0])
    hosts = _stores()
    placed.failed("e1", ["a1", "b1", "c1"])
    placed.failed("e2", ["a2", "b2", "c1"])
    assert placed.suspects(hosts) == {"c1"}
    now[0] += 121
    assert placed.suspects(hosts) == set()
