"""/docs serves Swagger UI over /openapi.json from files in the package (offline)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.server import ServerProcess


def test_docs_serves_swagger_ui_offline(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "node", stores=1).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            page = http.get("/docs")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            assert 'url: "/openapi.json"' in page.text
            # every file the page loads is served here, none from elsewhere
            assert "http://" not in page.text and "https://" not in page.text
            script = http.get("/docs/swagger-ui-bundle.js")
            assert script.status_code == 200 and "SwaggerUIBundle" in script.text
            style = http.get("/docs/swagger-ui.css")
            assert style.status_code == 200 and "swagger-ui" in style.text
            assert http.get("/docs/../openapi.py").status_code == 404
            assert http.get("/docs/nothing.js").status_code == 404
            document = http.get("/openapi.json").json()
            assert document["paths"]["/v1/queues"]["get"]["operationId"] == "listQueues"
    finally:
        server.stop()
