"""The web and command-line layer: the HTTP API (``api.app.create_app``), its Ray Serve
deployment (``api.serve_app``), live events (``api.sse``, ``api.hub``) and the ``canopy`` CLI."""

from importlib.metadata import version

# The one version number is the package's (pyproject.toml); the CLI and the OpenAPI document show it.
__version__ = version("canopy")
