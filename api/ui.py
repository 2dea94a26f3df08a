"""The web UI: the static files of ``frontend/`` served at ``/`` (after every API route)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles


def _frontend_dir() -> Path:
    here = Path(__file__).resolve().parent
    # An installed wheel carries the UI inside this package (pyproject's package-dir); a checkout
    # (or an editable install) has it beside api/.
    installed = here / "frontend"
    return installed if (installed / "index.html").is_file() else here.parent / "frontend"


FRONTEND_DIR = _frontend_dir()

_PLACEHOLDER = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Canopy</title></head>
<body><h1>Canopy</h1><p>The web UI is not installed here. The API lives under <code>/api/v1</code>;
its reference is at <a href="/docs">/docs</a>.</p></body></html>"""


def install(app: FastAPI, frontend_dir: Path = FRONTEND_DIR) -> None:
    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        page = frontend_dir / "index.html"
        return FileResponse(page) if page.is_file() else HTMLResponse(_PLACEHOLDER)

    # Last, so that it only sees what no API route matched (an unknown path is a JSON 404).
    app.mount("/", StaticFiles(directory=frontend_dir, html=True, check_dir=False), name="ui")
