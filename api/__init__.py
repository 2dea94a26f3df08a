"""The web and command-line layer: the HTTP API (``api.app.create_app``), its Ray Serve
deployment (``api.serve_app``), live events (``api.sse``, ``api.hub``) and the ``canopy`` CLI."""
