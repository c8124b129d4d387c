"""TLS for every listener of a cluster process and every internal client (docs/operations.md).

A process started with ``--tls-cert/--tls-key`` serves HTTP, WebSocket and the store
protocol over TLS, and its internal clients (input and output hosts to store hosts,
forwards between processes, internal publishes) connect with TLS, verifying the peer
against ``--tls-ca`` (else the system's store) and its address: certificates name the
hosts' advertised addresses (IP or DNS subject alternative names). A node's store hosts
are its own children on loopback: they stay plain TCP (their links are authenticated,
wire/handshake.py), only the node's API listener serves TLS. A server process holds its
contexts in its process context (context.py: ``tls_server``, ``tls_client``)."""

from __future__ import annotations

import os
import ssl

TLS_CA_ENV = "CHERAMI_TLS_CA"


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def client_context(ca: str | None = None, cadata: str | None = None) -> ssl.SSLContext:
    """Verifies the server against ``ca`` (a PEM file) or ``cadata`` (PEM text), else the
    system's trust store, and checks that its certificate names the address dialled."""
    context = ssl.create_default_context(cafile=ca, cadata=cadata)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def ca_pem() -> str | None:
    """The PEM text of the CA file CHERAMI_TLS_CA names (None when unset)."""
    path = os.environ.get(TLS_CA_ENV)
    if not path:
        return None
    with open(path) as f:
        return f.read()


def public_client(url: str, ca: str | None) -> ssl.SSLContext | bool:
    """What an API client passes as aiohttp's ``ssl``: a context verifying with ``ca``
    (or CHERAMI_TLS_CA) for https URLs; True (the default checks) otherwise."""
    ca = ca or os.environ.get(TLS_CA_ENV) or None
    if url.startswith("https://") and ca:
        return client_context(ca)
    return True
