"""The HTTP listener's limits in the small: the config's ``http`` object and its checks,
the stream caps per API key and per process, and aiohttp's server log telling a
malformed request as one INFO line (tests/integration/test_hostile_http.py runs them
on a real node)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from cherami.config import load_config
from cherami.errors import ConfigError, TooManyStreams
from cherami.httpbase import HttpLimits, ServerLog
from cherami.roles.frontend.auth import ApiKey
from cherami.roles.frontend.streams import StreamCaps

ALICE = ApiKey(key="alice", scopes=["produce"])
BOB = ApiKey(key="bob", scopes=["produce"])


def test_the_config_file_sets_the_http_limits(tmp_path: Path) -> None:
    file = tmp_path / "cherami.json"
    file.write_text(json.dumps({"http": {"header_timeout": 2.5, "max_streams_per_key": 7}}))
    config = load_config({}, str(file), env={})
    assert config.http == HttpLimits(header_timeout=2.5, max_streams_per_key=7)
    assert load_config({}, None, env={}).http == HttpLimits()  # 10 s, 60 s, 10,000, 1,000
    config.check(auth_enabled=False)


@pytest.mark.parametrize(
    "wrong", [{"header_timeout": 0}, {"body_timeout": -1}, {"max_streams": 0},
              {"max_streams_per_key": 0}, {"body_timeout": 7200}],
)  # fmt: skip
def test_a_limit_out_of_range_is_refused(wrong: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=f"http.{next(iter(wrong))}"):
        HttpLimits(**wrong).check()  # type: ignore[arg-type]


def _refused(caps: StreamCaps, key: ApiKey | None, limits: HttpLimits) -> TooManyStreams:
    with pytest.raises(TooManyStreams) as err, caps.hold(key, limits):
        pass
    return err.value


def test_streams_are_capped_per_key_then_per_process() -> None:
    caps, limits = StreamCaps(), HttpLimits(max_streams=3, max_streams_per_key=2)
    with caps.hold(ALICE, limits), caps.hold(ALICE, limits):
        err = _refused(caps, ALICE, limits)
        assert "max_streams_per_key" in err.message
        assert err.status == 429 and err.code == "too_many_streams"
        assert err.retry_after_header == "1"
        with caps.hold(BOB, limits):
            assert "max_streams;" in _refused(caps, BOB, limits).message
            assert "max_streams;" in _refused(caps, None, limits).message
        assert caps.total == 2
    assert caps.total == 0


def test_a_stream_that_fails_gives_its_slot_back() -> None:
    caps, limits = StreamCaps(), HttpLimits(max_streams=1, max_streams_per_key=1)
    with pytest.raises(RuntimeError), caps.hold(ALICE, limits):
        raise RuntimeError("the upgrade failed")
    with caps.hold(ALICE, limits):
        assert caps.total == 1


def test_without_keys_only_the_process_cap_holds() -> None:
    caps, limits = StreamCaps(), HttpLimits(max_streams=3, max_streams_per_key=1)
    with caps.hold(None, limits), caps.hold(None, limits), caps.hold(None, limits):
        assert "max_streams;" in _refused(caps, None, limits).message


def test_a_malformed_request_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server_log = ServerLog()
    err = BadHttpMessage("Invalid character in Content-Length:\n\n  b'lots'\n  ^")
    server_log.exception("Error handling request from %s", "10.0.0.7", exc_info=err)
    (record,) = caplog.records
    assert record.levelno == logging.INFO and record.exc_info is None
    assert record.getMessage() == (
        "malformed request from 10.0.0.7: BadHttpMessage: "
        "Invalid character in Content-Length: b'lots' ^"
    )
    caplog.clear()
    server_log.exception("Unhandled exception", exc_info=ValueError("a bug"))  # unchanged
    (record,) = caplog.records
    assert record.name == "aiohttp.server" and record.levelno == logging.ERROR
