"""The timing knobs live in the typed config (issue 13): read from a config file's
"timing" table, checked, and wrong values refused with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cherami import timing
from cherami.config import load_config
from cherami.errors import InvalidRequest


def test_a_config_file_sets_the_timing(tmp_path: Path) -> None:
    path = tmp_path / "cherami.json"
    path.write_text(json.dumps({"timing": {"lease_ttl": 6.0, "read_ahead": 5000}}))
    config = load_config({}, str(path), env={})
    assert config.timing.lease_ttl == 6.0 and config.timing.read_ahead == 5000
    assert config.timing.lease_margin == timing.DEFAULT.lease_margin  # the rest: defaults
    config.check(auth_enabled=False)
    assert load_config({}, None, env={}).timing == timing.DEFAULT


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lease_margin": 3.0}, "lease_margin < lease_ttl"),
        ({"ownership_tick": 2.9}, "ownership_tick < lease_ttl - lease_margin"),
        ({"dead_after": 0.5}, "dead_after"),
        ({"slow_tick": 0.4}, "ownership_tick < slow_tick"),
        ({"slow_tick": 2.6}, "slow_tick < lease_ttl - lease_margin"),
        ({"recovery_grace": 0.9}, "2 ownership_tick <= recovery_grace"),
        ({"seal_wait": 2.5}, "seal_wait < lease_ttl - lease_margin"),
        ({"outage_ask_timeout": 0}, "outage_ask_timeout"),
        ({"read_ahead": 10}, "read_ahead"),
    ],
)
def test_wrong_timing_is_refused(tmp_path: Path, values: dict[str, float], message: str) -> None:
    path = tmp_path / "cherami.json"
    path.write_text(json.dumps({"timing": values}))
    config = load_config({}, str(path), env={})
    with pytest.raises(InvalidRequest, match=message):
        config.check(auth_enabled=False)


def test_an_unknown_timing_knob_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cherami.json"
    path.write_text(json.dumps({"timing": {"lease_tll": 3}}))
    with pytest.raises(InvalidRequest, match="lease_tll"):
        load_config({}, str(path), env={})
