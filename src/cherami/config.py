"""Typed configuration of a node, loaded in one place: command-line arguments first,
then CHERAMI_* environment variables, then a config file (JSON, or TOML when its name
ends in ``.toml``), then defaults (so a deployment's environment overrides the file it
ships, and a flag overrides both)."""

from __future__ import annotations

import ipaddress
import os
import tomllib
from typing import Any

import msgspec

from cherami.errors import ConfigError
from cherami.httpbase import HttpLimits
from cherami.timing import Timing

ROLES = ("frontend", "controller", "inputhost", "outputhost", "storehost")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")


class NodeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    data_dir: str = "./data"
    host: str = "127.0.0.1"
    port: int = 8080
    stores: int = 3
    auth_file: str | None = None
    allow_remote_without_auth: bool = False
    log_level: str = "INFO"
    log_format: str = "text"  # or "json": one JSON object a line (cli/serve.py)
    role: str | None = None  # one role per process (a cluster); None: every role (a node)
    metadata: str | None = None  # sqlite:///path or postgresql://...; node default DIR/metadata.db
    advertise: str | None = None  # HOST:PORT other hosts reach this one at
    zone: str = ""  # a failure domain (rack, zone): replicas of an extent go to distinct ones
    load_report_interval: float = 2.0  # seconds between a host's load reports
    # the leading controller opens an extent for a queue above extent_target_rate for
    # this long on average, and seals one below half of it for scale_down_window
    scale_up_window: float = 10.0
    scale_down_window: float = 60.0
    extent_max_messages: int = 1_000_000  # an open extent this large is sealed, a new one opens
    # the secret internal connections prove (wire/handshake.py); a node makes its own
    cluster_secret_file: str | None = None
    timing: Timing = msgspec.field(default_factory=Timing)  # leases, ticks, read window
    # the HTTP listener: head and body timeouts, stream caps (httpbase.py)
    http: HttpLimits = msgspec.field(default_factory=HttpLimits)
    # TLS on every listener (and, in a cluster, every internal client): wire/tls.py
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None  # the CA internal clients verify peers with (default: system)
    # a store host's /metrics listener in a cluster (0: a free port; None: none); the
    # other roles serve /metrics on their API port and ignore it
    metrics_port: int | None = None
    # the SQS-compatible endpoint's port on an API process (0: a free one; None: none)
    sqs_port: int | None = None

    def log_level_name(self) -> str:
        """The logging level, checked with the log format: an unknown one is a one-line
        error."""
        name = self.log_level.upper()
        if name not in LOG_LEVELS:
            raise ConfigError(
                f"--log-level {self.log_level!r}: must be one of {', '.join(LOG_LEVELS)}"
            )
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
        return name

    def check(self, auth_enabled: bool) -> None:
        self.timing.check()
        self.http.check()
        if self.role is not None and self.role not in ROLES:
            raise ConfigError(f"--role must be one of {', '.join(ROLES)}")
        if self.role is not None and not self.metadata:
            raise ConfigError("--role needs --metadata (sqlite:///path or postgresql://...)")
        self.log_level_name()
        if self.extent_max_messages < 1:
            raise ConfigError("--extent-max-messages must be at least 1")
        if self.stores < 1:
            raise ConfigError("--stores must be at least 1")
        if not 0.1 <= self.load_report_interval <= 60:
            raise ConfigError("--load-report-interval must be 0.1 to 60 seconds")
        if not 0 < self.scale_up_window <= self.scale_down_window <= 3600:
            raise ConfigError(
                "--scale-up-window and --scale-down-window: 0 < up <= down <= 3600 seconds"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key),
                           ("--tls-ca", self.tls_ca)):  # fmt: skip
            if path and not os.path.isfile(path):
                raise ConfigError(f"{flag} {path}: no such file")
        if not auth_enabled and not self.allow_remote_without_auth and not _is_loopback(self.host):
            raise ConfigError(
                f"refusing to listen on {self.host} without API keys; give --auth-file, "
                "or --allow-remote-without-auth to accept that risk"
            )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_config_file(file: str) -> dict[str, Any]:
    """The settings of a JSON file, or of a TOML file (by its ``.toml`` name); an
    error names the file."""
    try:
        with open(file, "rb") as fh:
            raw = fh.read()
        if file.endswith(".toml"):
            return tomllib.loads(raw.decode())
        return msgspec.json.decode(raw, type=dict[str, Any])
    except OSError as err:
        raise ConfigError(f"config file {file}: {err.strerror or err}") from None
    except (msgspec.ValidationError, msgspec.DecodeError, tomllib.TOMLDecodeError,
            UnicodeDecodeError) as err:  # fmt: skip
        raise ConfigError(f"config file {file}: {err}") from None


def load_config(
    args: dict[str, Any], file: str | None = None, env: dict[str, str] | None = None
) -> NodeConfig:
    env = dict(os.environ) if env is None else env
    merged: dict[str, Any] = read_config_file(file) if file else {}
    for name in NodeConfig.__struct_fields__:
        value = env.get(f"CHERAMI_{name.upper()}")
        if value is not None:
            merged[name] = value
    merged.update({k: v for k, v in args.items() if v is not None})
    try:
        return msgspec.convert(merged, NodeConfig, strict=False)
    except msgspec.ValidationError as err:
        where = f" (flags, config file {file}, CHERAMI_* variables)" if file else ""
        raise ConfigError(f"configuration{where}: {err}") from None
