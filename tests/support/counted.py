"""A metadata store whose calls are counted by name (unit tests of how many reads a
piece of work makes)."""

from __future__ import annotations

from typing import Any


class Counted:
    """Every attribute of ``store`` asked for is a coroutine function that counts its
    calls in ``calls`` (by name) and awaits the store's own."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return await call(*args, **kwargs)

        return counted
