#!/usr/bin/env bash
# Build a Python base image for the Canopy image (Dockerfile, `--build-arg BASE=...`) from Debian's
# package mirror alone, for machines with no container registry to pull python:3.11-slim from.
#
#   bash .ci/canopy-base.sh [IMAGE]        # default: canopy-base:bookworm
#
# Idempotent: an image of this recipe's version is kept. How the image is made, the settings
# (DEBIAN_SUITE: bookworm has Python 3.11, DEBIAN_MIRROR, ...) and what it needs (a Docker engine,
# mmdebstrap): sandbox/image/debian.sh.
#
# The image is Debian minbase with python3, venv and pip, CA certificates, and the bash and wget
# that KubeRay's health probes run inside every Ray container. It holds no secret and no service.
set -euo pipefail
. "$(dirname "$0")/../sandbox/image/debian.sh"

IMAGE="${1:-canopy-base:bookworm}"
# Bump when the recipe changes: an image with another version is rebuilt.
IMAGE_VERSION=1
PACKAGES=(bash ca-certificates wget python3 python3-venv python3-pip)
CHANGES=('CMD ["python3"]' 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'ENV LANG=C.UTF-8')

debian_image canopy-base "$IMAGE" canopy.base-version "$IMAGE_VERSION" PACKAGES CHANGES
