"""A non-editable install serves the UI: the wheel built from this tree carries every file of
frontend/ (as api/frontend), and the app imported from an installed copy serves them over HTTP."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"
SHIPPED = sorted(path.relative_to(FRONTEND).as_posix() for path in FRONTEND.rglob("*")
                 if path.is_file() and path.name != "README.md")


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """The wheel of this working tree (tracked and new files, built outside the checkout so that no
    build/ or egg-info lands in it), installed with --target into a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="cnp-wheel-") as tmp:
        root = Path(tmp)
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                                check=True, capture_output=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            if (REPO / name).is_file():
                (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, root / "src" / name)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(root / "src"), "-w",
                        str(root / "dist")], check=True, timeout=300)
        wheel = next((root / "dist").glob("canopy-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            assert {f"api/frontend/{name}" for name in SHIPPED} <= set(archive.namelist())
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(root / "site"),
                        str(wheel)], check=True, timeout=300)
        yield root / "site"


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site)}


def test_installed_copy_serves_the_ui(installed: Path) -> None:
    where = subprocess.run([sys.executable, "-c", "import api.ui; print(api.ui.FRONTEND_DIR)"], env=_env(installed),
                           cwd=installed.parent, check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where) == installed / "api" / "frontend"  # the installed copy, not this checkout
    port = free_port()
    # No lifespan: the static UI needs no Runtime, so no database or Ray is started here.
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--lifespan", "off",
                               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                              env=_env(installed), cwd=installed.parent)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    index = http.get("/")
                    break
                except httpx.TransportError:
                    assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.2)
            assert index.status_code == 200 and index.text == (FRONTEND / "index.html").read_text()
            for name in SHIPPED:
                served = http.get(f"/{name}")
                assert served.status_code == 200, name
                assert served.content == (FRONTEND / name).read_bytes(), name
    finally:
        server.terminate()
        server.wait(timeout=30)
