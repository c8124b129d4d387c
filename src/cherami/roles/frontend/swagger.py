"""``/docs``: Swagger UI over ``/openapi.json``, from the files of the swagger-ui-bundle
package (nothing is fetched from elsewhere: it works offline). Open like the document
itself; an API key typed into its Authorize button is used for the calls it tries."""

from __future__ import annotations

from aiohttp import web
from swagger_ui_bundle import swagger_ui_path

_FILES = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "application/javascript",
    "swagger-ui-standalone-preset.js": "application/javascript",
}

_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Cherami HTTP API</title>
  <link rel="stylesheet" href="/docs/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui",
                                 deepLinking: true, persistAuthorization: true});
  </script>
</body>
</html>
"""


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=_PAGE, content_type="text/html")


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _FILES:
        raise web.HTTPNotFound()
    body = (swagger_ui_path / name).read_bytes()
    return web.Response(
        body=body, content_type=_FILES[name], headers={"Cache-Control": "max-age=86400"}
    )


def add_docs_routes(app: web.Application) -> None:
    app.router.add_get("/docs", _page)
    app.router.add_get("/docs/{name}", _asset)
