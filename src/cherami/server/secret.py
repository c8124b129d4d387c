"""Where a process's cluster secret comes from (wire/handshake.py says what it is for).

A cluster process takes ``--cluster-secret-file`` (or CHERAMI_CLUSTER_SECRET /
CHERAMI_CLUSTER_SECRET_FILE) and refuses to start without one. A node keeps its own in
``DATA_DIR/cluster.secret`` (made at its first start, mode 0600) unless given a file."""

from __future__ import annotations

import os

from cherami.errors import ConfigError
from cherami.wire import handshake as h

NODE_SECRET_FILE = "cluster.secret"


def _read(path: str) -> bytes:
    try:
        return h.read_secret_file(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cluster secret: {err}") from None


def role_secret(secret_file: str | None) -> bytes:
    """The secret of a cluster process: the file given, else the environment's."""
    if secret_file:
        return _read(secret_file)
    if os.environ.get(h.SECRET_ENV):
        return os.environ[h.SECRET_ENV].encode()
    if os.environ.get(h.SECRET_FILE_ENV):
        return _read(os.environ[h.SECRET_FILE_ENV])
    raise ConfigError(
        "a cluster process needs the cluster's secret (the same on every host): "
        "--cluster-secret-file FILE, or CHERAMI_CLUSTER_SECRET; make one with "
        "`openssl rand -hex 32 > FILE`"
    )


def node_secret(data_dir: str, secret_file: str | None) -> bytes:
    """A node's secret: the file given, else DATA_DIR/cluster.secret (made if missing)."""
    if secret_file:
        return _read(secret_file)
    path = os.path.join(data_dir, NODE_SECRET_FILE)
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(h.new_secret() + "\n")
    return _read(path)
