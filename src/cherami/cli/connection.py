"""What every client command shares: ``--url`` (``CHERAMI_URL``), ``--api-key``
(``CHERAMI_API_KEY``) and ``--tls-ca`` as one client factory, a client call run on a fresh
event loop, and the answer printed (output.py)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from cherami.cli.output import emit
from cherami.client.asyncclient import AsyncClient
from cherami.errors import Unavailable

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_URL = "http://127.0.0.1:8080"


def connection_options(command: F) -> F:
    """``--url`` and ``--api-key``, handed to the command as one ``client`` factory."""

    @click.option("--url", envvar="CHERAMI_URL", default=DEFAULT_URL, show_default=True,
                  callback=_check_url, help="Server URL (env CHERAMI_URL).")  # fmt: skip
    @click.option("--api-key", envvar="CHERAMI_API_KEY", default=None,
                  help="API key (env CHERAMI_API_KEY).")  # fmt: skip
    @click.option("--tls-ca", envvar="CHERAMI_TLS_CA", default=None,
                  help="PEM CA that verifies an https:// server (env CHERAMI_TLS_CA).")  # fmt: skip
    @functools.wraps(command)
    def wrapper(url: str, api_key: str | None, tls_ca: str | None, **kwargs: Any) -> Any:
        url = _check_url(None, None, _before_the_command("url", url))  # type: ignore[arg-type]
        api_key = _before_the_command("api_key", api_key)
        tls_ca = _before_the_command("tls_ca", tls_ca)
        return command(lambda: AsyncClient(url, api_key, tls_ca=tls_ca), **kwargs)

    return wrapper  # type: ignore[return-value]


def _before_the_command(name: str, value: Any) -> Any:
    """The option as given before the command (``cherami --url U queue list``) unless
    the command was given it itself; a flag beats the environment either way."""
    ctx = click.get_current_context()
    given = ctx.find_root().params.get(name)
    if given is not None and ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
        return given
    return value


def _check_url(ctx: click.Context, param: click.Parameter, url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r} must start with http:// or https://")
    return url


ClientFactory = Callable[[], AsyncClient]


def run(factory: ClientFactory, call: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Run one client call on a fresh event loop; a timeout becomes a one-line error."""

    async def main() -> T:
        async with factory() as client:
            try:
                return await call(client)
            except TimeoutError:
                raise Unavailable(f"{client.url}: request timed out") from None

    return asyncio.run(main())


def echo_json(value: Any) -> None:
    emit(value)  # JSON, or tables with --output table (output.py)
