"""The clients read CHERAMI_URL and CHERAMI_API_KEY like the CLI; arguments win."""

from __future__ import annotations

import pytest

from cherami import Client
from cherami.client.asyncclient import AsyncClient, connection_defaults


def test_environment_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHERAMI_URL", raising=False)
    monkeypatch.delenv("CHERAMI_API_KEY", raising=False)
    assert connection_defaults(None, None) == ("http://127.0.0.1:8080", None)
    monkeypatch.setenv("CHERAMI_URL", "http://queue.example:9000/")
    monkeypatch.setenv("CHERAMI_API_KEY", "k1")
    assert connection_defaults(None, None) == ("http://queue.example:9000/", "k1")
    assert connection_defaults("http://other:1", "k2") == ("http://other:1", "k2")
    client = AsyncClient()
    assert client.url == "http://queue.example:9000"
    assert client._headers == {"Authorization": "Bearer k1"}
    with Client() as sync:
        assert sync.url == "http://queue.example:9000"
