"""AWS Signature Version 4, checked as AWS checks it: the canonical request (method,
path, sorted query, the signed headers, the body's SHA-256), the string to sign over it
and the credential scope, and the HMAC chain from ``AWS4`` + the secret key through
date, region and service. Pure functions, tested against AWS's published examples."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, unquote

from cherami.roles.frontend.sqs.errors import SqsError, signature

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = 15 * 60  # seconds a request's X-Amz-Date may be off the server's clock
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=([^,\s]+)\s*,\s*SignedHeaders=([^,\s]+)\s*,"
    r"\s*Signature=([0-9a-fA-F]{64})\s*$"
)


@dataclass(frozen=True)
class Signed:
    """What the Authorization header claims."""

    access_key: str
    date: str  # YYYYMMDD of the scope
    region: str
    service: str
    signed_headers: list[str]
    signature: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def parse_authorization(header: str) -> Signed:
    match = _AUTH.match(header.strip())
    if match is None:
        raise signature(
            "IncompleteSignature",
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' "
            "with AWS4-HMAC-SHA256.",
        )
    credential, headers, sig = match.groups()
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise signature("IncompleteSignature", f"Credential {credential!r} is malformed.")
    return Signed(parts[0], parts[1], parts[2], parts[3], headers.split(";"), sig.lower())


def canonical_query(raw_query: str) -> str:
    pairs = []
    for item in raw_query.split("&") if raw_query else []:
        key, _, value = item.partition("=")
        pairs.append((_encode(unquote(key)), _encode(unquote(value))))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_request(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Iterable[tuple[str, str]],
    signed_headers: list[str],
    payload_sha256: str,
) -> str:
    """``headers``: (name, value) of the request, names in any case, repeats allowed."""
    values: dict[str, list[str]] = {}
    for name, value in headers:
        values.setdefault(name.lower(), []).append(" ".join(value.split()))
    lines = []
    for name in signed_headers:
        if name not in values:
            raise signature("SignatureDoesNotMatch", f"signed header {name} is missing")
        lines.append(f"{name}:{','.join(values[name])}\n")
    path = quote(unquote(raw_path or "/"), safe="/~")
    return "\n".join([
        method.upper(), path, canonical_query(raw_query), "".join(lines),
        ";".join(signed_headers), payload_sha256,
    ])  # fmt: skip


def string_to_sign(amz_date: str, scope: str, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(secret: str, signed: Signed, amz_date: str, canonical: str) -> str:
    key = signing_key(secret, signed.date, signed.region, signed.service)
    text = string_to_sign(amz_date, signed.scope, canonical)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def check_date(amz_date: str, signed: Signed, now: float) -> None:
    try:
        at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise signature("IncompleteSignature", f"X-Amz-Date {amz_date!r} is malformed.") from None
    if not amz_date.startswith(signed.date):
        raise signature("SignatureDoesNotMatch", "the credential's date is not X-Amz-Date's")
    if abs(at.timestamp() - now) > MAX_SKEW:
        raise signature(
            "SignatureDoesNotMatch",
            f"Signature expired: {amz_date} is more than 15 minutes off the server's time.",
        )


def verify(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: list[tuple[str, str]],
    body: bytes,
    secret_of: Callable[[str], str | None],
    now: float,
) -> Signed:
    """The request's claimed signature, once checked; SqsError otherwise.
    ``secret_of`` gives the secret key of an access key id (None: unknown)."""
    header = next((v for k, v in headers if k.lower() == "authorization"), None)
    if header is None:
        raise signature("MissingAuthenticationToken", "Request is missing Authentication Token")
    signed = parse_authorization(header)
    amz_date = next((v for k, v in headers if k.lower() == "x-amz-date"), None)
    if amz_date is None:
        raise signature("IncompleteSignature", "the request has no X-Amz-Date header")
    check_date(amz_date, signed, now)
    secret = secret_of(signed.access_key)
    if secret is None:
        raise signature(
            "InvalidClientTokenId", "The security token included in the request is invalid."
        )
    payload = hashlib.sha256(body).hexdigest()
    canonical = canonical_request(
        method, raw_path, raw_query, headers, signed.signed_headers, payload
    )
    if not hmac.compare_digest(sign(secret, signed, amz_date, canonical), signed.signature):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
            status=403,
        )
    return signed
