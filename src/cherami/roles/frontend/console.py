"""The web console at ``/ui/``: static files from the package (``ui/``), no build step
and nothing fetched from elsewhere. The page calls the public API with the key the
operator types in (kept in the tab's sessionStorage), so it sees only what that key
covers; the files themselves need no key. docs/console.md describes the pages."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

UI_DIR = Path(__file__).with_name("ui")
TYPES = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "messages.js": "text/javascript",  # the queue page's messages panel
    "console.css": "text/css",
}
# everything from this origin only: the page works offline and loads no third-party code
POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'"
)


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info.get("name") or "index.html"
    content_type = TYPES.get(name)
    if content_type is None:
        raise web.HTTPNotFound()  # errors_middleware: 404 not_found
    return web.Response(
        body=(UI_DIR / name).read_bytes(),
        content_type=content_type,
        charset="utf-8",
        headers={
            "Cache-Control": "no-cache",
            "Content-Security-Policy": POLICY,
            "X-Content-Type-Options": "nosniff",
        },
    )


async def _to_index(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/")


def add_console_routes(app: web.Application) -> None:
    """Registered by build_app."""
    app.add_routes([
        web.get("/ui", _to_index),
        web.get("/ui/", _asset),
        web.get("/ui/{name}", _asset),
    ])  # fmt: skip
