"""``--config`` reads JSON or TOML (by the ``.toml`` name); every error names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cherami.config import load_config
from cherami.errors import InvalidRequest


def test_toml_and_json_give_the_same_config(tmp_path: Path) -> None:
    toml = tmp_path / "cherami.toml"
    toml.write_text('data_dir = "/var/lib/cherami"\nport = 9000\nzone = "a"\n')
    json_file = tmp_path / "cherami.json"
    json_file.write_text('{"data_dir": "/var/lib/cherami", "port": 9000, "zone": "a"}')
    from_toml = load_config({}, str(toml), env={})
    assert from_toml == load_config({}, str(json_file), env={})
    assert (from_toml.port, from_toml.zone, from_toml.data_dir) == (9000, "a", "/var/lib/cherami")
    # flags over CHERAMI_*, CHERAMI_* over the file (docs/operations.md §5)
    config = load_config(
        {"port": 7000},
        str(toml),
        env={"CHERAMI_ZONE": "b", "CHERAMI_STORES": "5", "CHERAMI_PORT": "7100"},
    )
    assert (config.port, config.zone, config.stores, config.data_dir) == (
        7000, "b", 5, "/var/lib/cherami",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("bad.toml", "port = = 1\n", "bad.toml"),
        ("bad.json", "{port: 1}", "bad.json"),
        ("unknown.toml", "prot = 1\n", "unknown field `prot`"),
        ("type.toml", 'port = "eighty"\n', "Expected `int`"),
    ],
)
def test_errors_name_the_file(tmp_path: Path, name: str, text: str, says: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InvalidRequest) as err:
        load_config({}, str(path), env={})
    assert says in str(err.value) and str(path) in str(err.value)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(InvalidRequest, match=f"config file {missing}: No such file"):
        load_config({}, str(missing), env={})
