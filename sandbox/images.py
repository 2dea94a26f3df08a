"""Which sandbox image is which, and how each one is built.

- ``canopy-sandbox-python:latest`` (the default ``CANOPY_SANDBOX_IMAGE``): Debian with Python 3
  and common command-line tools, built from Debian's package mirror by ``sandbox/image/build.sh``
  (no container registry needed), for real work.
- ``canopy-sandbox:latest``: the offline busybox image ``.ci/docker-up.sh`` builds in seconds,
  which the tests and CI name explicitly.
- Any other image works when it has what sandbox/docker_backend.py needs (``sh``, ``setsid``,
  ``kill``, ...) and runs as a non-root user.
"""

from __future__ import annotations

from pathlib import Path

from persistence.settings import Settings

DEFAULT_IMAGE: str = Settings.model_fields["sandbox_image"].default
TEST_IMAGE = "canopy-sandbox:latest"
BUILD_SCRIPT = Path(__file__).resolve().parent / "image" / "build.sh"


def build_hint(image: str) -> str:
    """What to do when ``image`` is not on the engine."""
    if image == DEFAULT_IMAGE:
        return (f"build it with `bash {BUILD_SCRIPT}` (Debian with Python 3, from Debian's package mirror; a few "
                "minutes), or set CANOPY_SANDBOX_IMAGE to an image you have")
    if image == TEST_IMAGE:
        return "build it with `bash .ci/docker-up.sh` (the offline busybox image of the tests)"
    return (f"pull or build it, or set CANOPY_SANDBOX_IMAGE to an image you have (`bash {BUILD_SCRIPT}` builds "
            f"Canopy's default, {DEFAULT_IMAGE})")
