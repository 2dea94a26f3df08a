"""The API reference pages, ``/docs`` (Swagger UI) and ``/redoc``: FastAPI's own, but with their
scripts pinned to one version and checked by hash (Subresource Integrity). They run on the UI's
origin, which keeps the API key in the browser's storage: a floating ``@5`` from a CDN ran whatever
that CDN served. The hashes are of the files in the packages' npm tarballs, which the CDN serves as
they are; a new version takes new hashes (``openssl dgst -sha384 -binary FILE | openssl base64 -A``).
"""

from __future__ import annotations

import html

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

_CDN = "https://cdn.jsdelivr.net/npm"
SWAGGER_JS = (f"{_CDN}/swagger-ui-dist@5.35.0/swagger-ui-bundle.js",
              "sha384-gjRm0bEPMeTmMh5jT2cHccIwCUZSTd8YC+j0d0sXw0MdGEfScduGpSyF3ZSSLkX9")
SWAGGER_CSS = (f"{_CDN}/swagger-ui-dist@5.35.0/swagger-ui.css",
               "sha384-WlYgdmXYOOBWL5apwjDEZwN+U3HmXSSu5R6V5aGxEcf7z+KuRNwBhoxKVN1i3D5I")
REDOC_JS = (f"{_CDN}/redoc@2.5.4/bundles/redoc.standalone.js",
            "sha384-w447zOpYfw/1Tv/5AK9NfHTlQIqE3RVR6KY62jCyy9zNDgO64cMwGGP1Fj0zJVf5")


def _script(source: tuple[str, str]) -> str:
    return f'<script src="{source[0]}" integrity="{source[1]}" crossorigin="anonymous"></script>'


def install(app: FastAPI) -> None:
    """The two pages (the app is made with ``docs_url=None, redoc_url=None``)."""
    title, spec = html.escape(app.title), app.openapi_url

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return HTMLResponse(f"""<!doctype html><html><head><meta charset="utf-8"><title>{title} - Swagger UI</title>
<link rel="stylesheet" href="{SWAGGER_CSS[0]}" integrity="{SWAGGER_CSS[1]}" crossorigin="anonymous"></head>
<body><div id="swagger-ui"></div>{_script(SWAGGER_JS)}
<script>SwaggerUIBundle({{url: "{spec}", dom_id: "#swagger-ui", layout: "BaseLayout", deepLinking: true,
presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset]}});</script></body></html>""")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return HTMLResponse(f"""<!doctype html><html><head><meta charset="utf-8"><title>{title} - ReDoc</title></head>
<body><redoc spec-url="{spec}"></redoc>{_script(REDOC_JS)}</body></html>""")
