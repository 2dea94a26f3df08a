"""The shared per-tree sandbox (SPEC §12): backends, confined file access, lifecycle manager.

Layering: ``sandbox`` imports ``persistence`` and nothing else of Canopy.
"""

from sandbox.base import (
    OUTPUT_LIMIT_BYTES,
    TRUNCATION_MARKER,
    CommandResult,
    FileMissing,
    PathRejected,
    SandboxBackend,
    SandboxError,
    SandboxGone,
    SandboxOptions,
    SandboxUnavailable,
)
from sandbox.files import read_file, write_file
from sandbox.manager import SandboxManager, backend_warning, choose_backend

__all__ = [
    "OUTPUT_LIMIT_BYTES",
    "TRUNCATION_MARKER",
    "CommandResult",
    "FileMissing",
    "PathRejected",
    "SandboxBackend",
    "SandboxError",
    "SandboxGone",
    "SandboxManager",
    "SandboxOptions",
    "SandboxUnavailable",
    "backend_warning",
    "choose_backend",
    "read_file",
    "write_file",
]
