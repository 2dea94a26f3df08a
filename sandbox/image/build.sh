#!/usr/bin/env bash
# Build Canopy's default sandbox image: Debian with Python 3 and the command-line tools an agent
# expects (bash, coreutils, git, curl, grep/sed/awk, tar/gzip, findutils, procps, ca-certificates,
# pip and venv), from Debian's package mirror alone: no container registry is needed.
#
#   bash sandbox/image/build.sh [IMAGE]        # default: canopy-sandbox-python:latest
#
# Idempotent: an image of this recipe's version is kept. How the image is made, the settings
# (DEBIAN_SUITE, DEBIAN_MIRROR, ...) and what it needs (a Docker engine, mmdebstrap): debian.sh.
#
# The sandbox runs it with a read-only root, every capability dropped and a non-root user
# (sandbox/docker_backend.py), so the image carries no service and no setuid use: it is a
# filesystem with a `canopy` user (uid 10001, CANOPY_SANDBOX_USER's default) whose home is /tmp.
set -euo pipefail
. "$(dirname "$0")/debian.sh"

IMAGE="${1:-canopy-sandbox-python:latest}"
# Bump when the recipe changes: an image with another version is rebuilt.
IMAGE_VERSION=1
PACKAGES=(
    bash coreutils util-linux findutils grep sed gawk tar gzip bzip2 xz-utils unzip zip
    procps less file diffutils patch jq
    git curl ca-certificates
    python3 python3-pip python3-venv
)
CHANGES=('CMD ["sleep", "infinity"]' 'WORKDIR /workspace'
         'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'ENV LANG=C.UTF-8'
         'ENV PIP_DISABLE_PIP_VERSION_CHECK=1')
# /workspace is the project bind mount; /tmp a tmpfs at run time, and the sandbox user's home.
customize='mkdir -p "$1/workspace" && chmod 1777 "$1/tmp"
echo "canopy:x:10001:10001:canopy sandbox:/tmp:/bin/bash" >> "$1/etc/passwd"
echo "canopy:x:10001:" >> "$1/etc/group"
echo "canopy:*:19000:0:99999:7:::" >> "$1/etc/shadow"'

debian_image sandbox-image "$IMAGE" canopy.image-version "$IMAGE_VERSION" PACKAGES CHANGES "$customize"
echo "sandbox-image: use it: CANOPY_SANDBOX_IMAGE=$IMAGE (the default of canopy up)"
