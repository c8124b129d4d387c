"""A test certificate authority and server certificates, made with the openssl CLI."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Certs:
    ca: Path  # the CA certificate (PEM) clients verify with
    cert: Path  # a server certificate the CA signed, for 127.0.0.1 and localhost
    key: Path
    other_ca: Path  # a CA that signed nothing here (a client trusting it must refuse)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)  # fmt: skip
    return cert, key


def make_certs(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1",)) -> Certs:
    """A CA, a server certificate for ``hosts`` (IP addresses) and localhost, and an
    unrelated CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca(directory, "test-ca")
    other_ca, _ = _ca(directory, "other-ca")
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=cherami",
             "-keyout", str(key), "-out", str(csr), cwd=directory)  # fmt: skip
    names = ",".join([*(f"IP:{h}" for h in hosts), "DNS:localhost"])
    ext = directory / "server.ext"
    ext.write_text(f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert),
             cwd=directory)  # fmt: skip
    return Certs(ca=ca, cert=cert, key=key, other_ca=other_ca)
