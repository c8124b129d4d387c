"""One process context (issue 28): timing, clock, cluster key and TLS are built once by
the process shell and passed to the roles, never kept in module globals; two contexts
live side by side in one interpreter."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from cherami import context, timing
from cherami.config import NodeConfig
from cherami.context import ProcessContext
from cherami.errors import ConfigError
from cherami.roles.controller.leader import Leader
from cherami.roles.outputhost.ownership import ExtentOwnership
from cherami.server.roleprocess import RoleProcess
from cherami.wire import handshake, tls
from tests.support.tlscerts import make_certs

SRC = Path(__file__).resolve().parents[2] / "src" / "cherami"


def test_no_module_keeps_process_state_in_a_global() -> None:
    """No ``global`` statement anywhere in src/cherami (timing.use, handshake.use_secret
    and tls.use_tls set one each), and none of their names is back."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Global):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} global {node.names}")
    assert not found, "module globals set at run time:\n" + "\n".join(found)
    for module, names in [
        (timing, ("current", "use")),
        (handshake, ("_key", "use_secret")),
        (tls, ("_server", "_client", "use_tls", "listener", "internal_client")),
    ]:
        assert not [n for n in names if hasattr(module, n)], module.__name__
    with pytest.raises(AttributeError):  # a context is frozen
        context.DEFAULT.timing = timing.DEFAULT  # type: ignore[misc]


def test_two_contexts_side_by_side() -> None:
    """Each role keeps its own process's timing, clock and key (with the globals, the
    last process built in an interpreter set them for every other)."""
    slow = msgspec.structs.replace(
        timing.DEFAULT, ownership_tick=1.0, slow_tick=2.0, lease_ttl=10.0
    )
    a = ProcessContext.of(timing.DEFAULT, b"a" * 32, clock=lambda: 1.0)
    b = ProcessContext.of(slow, b"b" * 32, clock=lambda: 2.0)
    assert a.cluster_key() == handshake.derive_key(b"a" * 32) != b.cluster_key()
    assert a.internal_ok(a.internal_headers()[handshake.INTERNAL_HEADER])
    assert not b.internal_ok(a.internal_headers()[handshake.INTERNAL_HEADER])
    one = ExtentOwnership(None, None, "a", a)  # type: ignore[arg-type]
    two = ExtentOwnership(None, None, "b", b)  # type: ignore[arg-type]
    assert (one.clock(), one.orphan_after) == (1.0, 1.0)
    assert (two.clock(), two.orphan_after) == (2.0, 2.0)
    stores = SimpleNamespace(stores=None)
    leader = Leader(None, None, "c", stores, ctx=b)  # type: ignore[arg-type]
    assert leader.clock() == 2.0 and leader.timing is slow


def test_the_context_is_checked_and_carries_tls(tmp_path: Path) -> None:
    bad = msgspec.structs.replace(timing.DEFAULT, lease_margin=5.0)
    with pytest.raises(ConfigError):
        ProcessContext.of(bad)
    certs = make_certs(tmp_path)
    ctx = ProcessContext.of(timing.DEFAULT, None, str(certs.cert), str(certs.key), str(certs.ca))
    assert isinstance(ctx.tls_server, ssl.SSLContext) and isinstance(ctx.tls_client, ssl.SSLContext)
    assert (ctx.http_scheme, ctx.ws_scheme) == ("https", "wss")
    plain = ProcessContext.of(timing.DEFAULT)
    assert plain.tls_server is None and (plain.http_scheme, plain.ws_scheme) == ("http", "ws")


def test_a_role_process_builds_its_context_from_its_config(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    config = NodeConfig(
        role="outputhost", metadata="sqlite:///x", data_dir=str(tmp_path / "d"),
        cluster_secret_file=str(secret),
        timing=msgspec.structs.replace(timing.DEFAULT, dead_after=9.0),
    )  # fmt: skip
    process = RoleProcess(config)
    assert process.ctx.timing.dead_after == 9.0
    assert process.ctx.cluster_key() == handshake.derive_key(b"s" * 32)
    assert process.ctx.tls_server is None
