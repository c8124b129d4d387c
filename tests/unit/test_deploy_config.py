"""The config that deploy/ ships (the systemd unit's and the Docker image's
/etc/cherami/cherami.toml) loads and passes the server's checks, and both name it."""

from __future__ import annotations

from pathlib import Path

from cherami.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_shipped_config_loads_and_is_named_by_unit_and_image() -> None:
    config = load_config({}, str(DEPLOY / "systemd" / "cherami.toml"), env={})
    config.check(auth_enabled=True)  # 0.0.0.0 is allowed with keys only
    assert (config.host, config.port, config.data_dir) == ("0.0.0.0", 8080, "/var/lib/cherami")
    assert config.auth_file == "/etc/cherami/keys.json"
    unit = (DEPLOY / "systemd" / "cherami.service").read_text()
    assert "serve --config /etc/cherami/cherami.toml" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit  # SIGHUP reloads the auth file
    image = (DEPLOY / "Dockerfile").read_text()
    assert "COPY deploy/systemd/cherami.toml /etc/cherami/cherami.toml" in image
    assert 'CMD ["--config", "/etc/cherami/cherami.toml"]' in image
