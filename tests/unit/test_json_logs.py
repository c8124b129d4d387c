"""``--log-format json``: one JSON object a line, with the fields a call passed."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from cherami.cli.serve import JsonLogFormatter
from cherami.config import NodeConfig
from cherami.errors import InvalidRequest


def test_a_record_is_one_json_line() -> None:
    record = logging.makeLogRecord({
        "name": "cherami.outputhost.groupconsumer", "levelname": "WARNING", "levelno": 30,
        "msg": "moving %d to the DLQ failed", "args": (3,), "queue": "orders", "seq": 7,
    })  # fmt: skip
    line = JsonLogFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "WARNING" and entry["logger"] == "cherami.outputhost.groupconsumer"
    assert entry["message"] == "moving 3 to the DLQ failed"
    assert (entry["queue"], entry["seq"]) == ("orders", 7)
    assert entry["time"][:4].isdigit() and "T" in entry["time"]


def test_a_traceback_stays_inside_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.makeLogRecord({"msg": "failed", "exc_info": sys.exc_info()})
    entry = json.loads(JsonLogFormatter().format(record))
    assert "ValueError: boom" in entry["traceback"]


def test_unknown_format_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="--log-format must be one of text, json"):
        NodeConfig(log_format="xml").log_level_name()
