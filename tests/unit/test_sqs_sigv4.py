"""Signature Version 4 as the SQS endpoint checks it: AWS's published examples (the IAM
ListUsers request of the SigV4 guide, the get-vanilla case of AWS's SigV4 test suite),
and requests botocore itself signed, taken or refused."""

from __future__ import annotations

import hashlib
import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from cherami.roles.frontend.sqs import credentials, sigv4
from cherami.roles.frontend.sqs.errors import SqsError

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
EMPTY = hashlib.sha256(b"").hexdigest()


def test_the_sigv4_guide_example() -> None:
    headers = [
        ("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"),
        ("Host", "iam.amazonaws.com"),
        ("X-Amz-Date", "20150830T123600Z"),
    ]
    signed = ["content-type", "host", "x-amz-date"]
    canonical = sigv4.canonical_request(
        "GET", "/", "Action=ListUsers&Version=2010-05-08", headers, signed, EMPTY
    )
    assert hashlib.sha256(canonical.encode()).hexdigest() == (
        "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
    )
    key = sigv4.signing_key(SECRET, "20150830", "us-east-1", "iam")
    assert key.hex() == "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
    claim = sigv4.Signed("AKIDEXAMPLE", "20150830", "us-east-1", "iam", signed, "")
    assert sigv4.sign(SECRET, claim, "20150830T123600Z", canonical) == (
        "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
    )


def test_the_test_suites_get_vanilla() -> None:
    headers = [("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")]
    canonical = sigv4.canonical_request("GET", "/", "", headers, ["host", "x-amz-date"], EMPTY)
    claim = sigv4.Signed("AKIDEXAMPLE", "20150830", "us-east-1", "service",
                         ["host", "x-amz-date"], "")  # fmt: skip
    assert sigv4.sign(SECRET, claim, "20150830T123600Z", canonical) == (
        "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    )


def test_the_canonical_query_is_sorted_and_encoded() -> None:
    assert sigv4.canonical_query("b=2&a=x%20y&a=1&c") == "a=1&a=x%20y&b=2&c="


def _botocore_signed(body: bytes, secret: str = SECRET) -> AWSRequest:
    request = AWSRequest(
        method="POST", url="http://127.0.0.1:9324/", data=body,
        headers={"X-Amz-Target": "AmazonSQS.ListQueues",
                 "Content-Type": "application/x-amz-json-1.0"},
    )  # fmt: skip
    SigV4Auth(Credentials("AKIDEXAMPLE", secret), "sqs", "eu-west-1").add_auth(request)
    request.headers["Host"] = "127.0.0.1:9324"
    return request


def _secret(key: str) -> str | None:
    return SECRET if key == "AKIDEXAMPLE" else None


def _verify(request: AWSRequest, body: bytes) -> sigv4.Signed:
    return sigv4.verify("POST", "/", "", list(request.headers.items()), body, _secret, time.time())


def _verify_headers(headers: list[tuple[str, str]], now: float) -> sigv4.Signed:
    return sigv4.verify("POST", "/", "", headers, b"{}", _secret, now)


def test_a_request_botocore_signed_is_taken() -> None:
    body = b"{}"
    signed = _verify(_botocore_signed(body), body)
    claimed = (signed.access_key, signed.region, signed.service)
    assert claimed == ("AKIDEXAMPLE", "eu-west-1", "sqs")


def test_a_wrong_secret_or_a_changed_body_is_refused() -> None:
    with pytest.raises(SqsError) as caught:
        _verify(_botocore_signed(b"{}", secret="not the secret"), b"{}")
    assert (caught.value.code, caught.value.status) == ("SignatureDoesNotMatch", 403)
    with pytest.raises(SqsError) as caught:
        _verify(_botocore_signed(b"{}"), b'{"QueueNamePrefix":"x"}')
    assert caught.value.code == "SignatureDoesNotMatch"


def test_an_unknown_key_a_missing_or_malformed_header_or_an_old_date_is_refused() -> None:
    request = _botocore_signed(b"{}")
    cases = {
        "InvalidClientTokenId": lambda h: h.__setitem__(
            "Authorization", h["Authorization"].replace("AKIDEXAMPLE", "AKIDOTHER")
        ),
        "MissingAuthenticationToken": lambda h: h.__delitem__("Authorization"),
        "IncompleteSignature": lambda h: h.__setitem__("Authorization", "AWS4-HMAC-SHA256 x"),
    }
    for code, change in cases.items():
        headers = dict(request.headers.items())
        change(headers)
        with pytest.raises(SqsError) as caught:
            _verify_headers(list(headers.items()), time.time())
        assert caught.value.code == code
    with pytest.raises(SqsError) as caught:  # 20 minutes later
        _verify_headers(list(request.headers.items()), time.time() + 1200)
    assert "expired" in caught.value.message


def test_a_keys_credentials() -> None:
    """The secret is the key's SHA-256 as the auth file keeps it; the id, which travels
    in clear, is derived from the secret one way."""
    secret = hashlib.sha256(b"chk_example").hexdigest()
    key_id = hashlib.sha256(secret.encode()).hexdigest()[:20].upper()
    assert credentials("chk_example") == (key_id, secret)
