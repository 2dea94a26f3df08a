"""The shared per-tree sandbox (SPEC §12): backends, confined file access, lifecycle manager.

Layering: ``sandbox`` imports ``persistence`` and nothing else of Canopy. The package imports none
of its modules: a session process reaches sandboxes through their hosts (actors/sandbox_hosts.py)
and carries neither backend's dependencies (the Docker SDK).
"""
