"""The web and command-line layer: the ``canopy`` CLI (and, later, the HTTP API)."""
