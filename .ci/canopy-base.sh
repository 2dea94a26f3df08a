#!/usr/bin/env bash
# Build a Python base image for the Canopy image (Dockerfile, `--build-arg BASE=...`) from Debian's
# package mirror alone, for machines with no container registry to pull python:3.11-slim from.
#
#   bash .ci/canopy-base.sh [IMAGE]        # default: canopy-base:bookworm
#
# Env: DEBIAN_SUITE (bookworm: Python 3.11), DEBIAN_MIRROR (http://deb.debian.org/debian),
# DEBIAN_SECURITY_MIRROR (http://deb.debian.org/debian-security). Needs root (or a user mmdebstrap
# can unshare for), `mmdebstrap` (installed with apt-get when missing and root) and a Docker engine.
# Idempotent: an image of this recipe's version is kept.
#
# The image is Debian minbase with python3, venv and pip, CA certificates, and the bash and wget
# that KubeRay's health probes run inside every Ray container. It holds no secret and no service.
set -euo pipefail

IMAGE="${1:-canopy-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
# Bump when the recipe changes: an image with another version is rebuilt.
IMAGE_VERSION=1
PACKAGES=(bash ca-certificates wget python3 python3-venv python3-pip)

say() { echo "canopy-base: $*"; }

if [ "$(docker image inspect -f '{{index .Config.Labels "canopy.base-version"}}' "$IMAGE" 2>/dev/null)" \
        = "$IMAGE_VERSION" ]; then
    say "$IMAGE present (recipe version $IMAGE_VERSION); nothing to do"
    exit 0
fi
docker info >/dev/null 2>&1 || { say "no Docker engine answers: start one (bash .ci/docker-up.sh does)"; exit 1; }
if ! command -v mmdebstrap >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { say "mmdebstrap is missing: apt-get install mmdebstrap"; exit 1; }
    say "installing mmdebstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi

say "building $IMAGE from Debian $SUITE ($MIRROR); packages: ${PACKAGES[*]}"
started=$(date +%s)
old_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
mmdebstrap --quiet --variant=minbase --format=tar \
    --include="$(IFS=,; echo "${PACKAGES[*]}")" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --aptopt='Acquire::Languages "none"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log' \
    "$SUITE" - \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main" |
    docker import \
        --change 'CMD ["python3"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change "LABEL canopy.base-version=$IMAGE_VERSION" \
        - "$IMAGE" >/dev/null
if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]; then
    # The outdated image lost its tag; drop it unless a container or image still uses it.
    docker image rm "$old_id" >/dev/null 2>&1 || say "kept the outdated image $old_id (in use)"
fi
say "$IMAGE built in $(( $(date +%s) - started )) s ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
