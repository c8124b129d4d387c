"""Token buckets, the auth file's forms and checks, and the 429 error's retry hint."""

from __future__ import annotations

import json
import time

import pytest

from cherami.errors import BacklogFull, InvalidRequest, Throttled, error_from_response
from cherami.roles.frontend.auth import KeyRing, hash_key, new_key, parse_keys
from cherami.roles.frontend.throttle import TokenBucket


def test_a_bucket_holds_its_burst_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=100, burst=10)
    now = bucket.at
    assert bucket.wait(10, now) == 0
    bucket.take(10)
    assert bucket.wait(1, now) == pytest.approx(0.01)
    assert bucket.wait(5, now + 0.05) == 0  # 5 tokens back after 50 ms
    assert bucket.wait(50, now + 1.0) == 0  # full again, never above its burst
    assert bucket.tokens == 10


def test_a_batch_larger_than_the_bucket_passes_when_full_and_leaves_a_debt() -> None:
    bucket = TokenBucket(rate=100, burst=0)  # burst 0: one second's worth
    now = bucket.at
    assert bucket.capacity == 100 and bucket.wait(1000, now) == 0
    bucket.take(1000)
    # the debt of 900 and a full bucket again: 10 s at 100/s, so the long-run rate holds
    assert bucket.wait(1000, now) == pytest.approx(10.0)


def test_a_new_rate_applies_without_losing_the_debt() -> None:
    bucket = TokenBucket(rate=10, burst=10)
    bucket.take(30)
    bucket.configure(rate=100, burst=50)
    assert (bucket.rate, bucket.capacity) == (100, 50)
    assert bucket.wait(10, time.monotonic()) == pytest.approx(0.3, abs=0.01)


def test_hashed_and_plain_keys_are_found_by_the_key_only() -> None:
    key = new_key()
    ring = KeyRing(parse_keys(json.dumps([
        {"key_sha256": hash_key(key).hex().upper(), "scopes": ["produce"], "publish_rate": 5},
        {"key": "plain", "scopes": ["admin"]},
    ]).encode(), "keys.json"))  # fmt: skip
    found = ring.find(f"Bearer {key}")
    assert found is not None and found.publish_rate == 5 and found.key is None
    assert ring.find("Bearer plain") is not None
    assert ring.find(f"Bearer {hash_key(key).hex()}") is None
    assert ring.find(key) is None and ring.find(None) is None
    assert key.startswith("chk_") and len(key) > 40


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([{"scopes": ["admin"]}], "needs one of key or key_sha256"),
        ([{"key": "a", "key_sha256": "0" * 64, "scopes": ["admin"]}], "needs one of"),
        ([{"key_sha256": "zz" * 32, "scopes": ["admin"]}], "64 hex digits"),
        ([{"key": "", "scopes": ["admin"]}], "an empty key"),
        (
            [
                {"key": "a", "scopes": ["admin"]},
                {"key_sha256": hash_key("a").hex(), "scopes": ["produce"]},
            ],
            "repeats a key",
        ),  # fmt: skip
        ([{"key": "a", "scopes": ["admin"], "publish_rat": 1}], "unknown field"),
        ([{"key": "a", "scopes": ["admin"], "publish_rate": -1}], "publish_rate"),
    ],
)
def test_a_bad_auth_file_says_what_is_wrong(entries: list[object], says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_keys(json.dumps(entries).encode(), "keys.json")


def test_a_429_carries_its_wait_to_the_client() -> None:
    err = Throttled("over", retry_after=0.2501)
    body = json.dumps(err.to_dict()).encode()
    assert (err.retry_after_ms, err.retry_after_header) == (251, "1")
    back = error_from_response(429, body)
    assert isinstance(back, Throttled) and back.retry_after == pytest.approx(0.251)
    full = error_from_response(429, json.dumps(BacklogFull("full", 3.2).to_dict()).encode())
    assert isinstance(full, BacklogFull) and full.code == "backlog_full"
    assert BacklogFull("x", 3.2).retry_after_header == "4"
