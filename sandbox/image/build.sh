#!/usr/bin/env bash
# Build Canopy's default sandbox image: Debian with Python 3 and the command-line tools an agent
# expects (bash, coreutils, git, curl, grep/sed/awk, tar/gzip, findutils, procps, ca-certificates,
# pip and venv), from Debian's package mirror alone: no container registry is needed.
#
#   bash sandbox/image/build.sh [IMAGE]        # default: canopy-sandbox-python:latest
#
# Env: DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (http://deb.debian.org/debian),
# DEBIAN_SECURITY_MIRROR (http://deb.debian.org/debian-security). Needs root (or a user
# mmdebstrap can unshare for), the `mmdebstrap` package (installed with apt-get when missing and
# root) and a Docker engine. Idempotent: an image of this recipe's version is kept.
#
# Why not `docker build`: a Dockerfile starts FROM an image, and there may be no registry to pull
# one from; mmdebstrap writes a root filesystem as a tarball, which `docker import` turns into an
# image. The sandbox runs it with a read-only root, every capability dropped and a non-root user
# (sandbox/docker_backend.py), so the image carries no service and no setuid use: it is a
# filesystem with a `canopy` user (uid 10001, CANOPY_SANDBOX_USER's default) whose home is /tmp.
set -euo pipefail

IMAGE="${1:-canopy-sandbox-python:latest}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
# Bump when the recipe changes: an image with another version is rebuilt.
IMAGE_VERSION=1
PACKAGES=(
    bash coreutils util-linux findutils grep sed gawk tar gzip bzip2 xz-utils unzip zip
    procps less file diffutils patch jq
    git curl ca-certificates
    python3 python3-pip python3-venv
)

say() { echo "sandbox-image: $*"; }

if [ "$(docker image inspect -f '{{index .Config.Labels "canopy.image-version"}}' "$IMAGE" 2>/dev/null)" \
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

# /workspace is the project bind mount; /tmp a tmpfs at run time, and the sandbox user's home.
customize='mkdir -p "$1/workspace" && chmod 1777 "$1/tmp"
echo "canopy:x:10001:10001:canopy sandbox:/tmp:/bin/bash" >> "$1/etc/passwd"
echo "canopy:x:10001:" >> "$1/etc/group"
echo "canopy:*:19000:0:99999:7:::" >> "$1/etc/shadow"
rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log'

say "building $IMAGE from Debian $SUITE ($MIRROR); packages: ${PACKAGES[*]}"
started=$(date +%s)
old_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
mmdebstrap --quiet --variant=minbase --format=tar \
    --include="$(IFS=,; echo "${PACKAGES[*]}")" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --aptopt='Acquire::Languages "none"' \
    --customize-hook="$customize" \
    "$SUITE" - \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main" |
    docker import \
        --change 'CMD ["sleep", "infinity"]' \
        --change 'WORKDIR /workspace' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
        --change "LABEL canopy.image-version=$IMAGE_VERSION" \
        - "$IMAGE" >/dev/null
if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]; then
    # The outdated image lost its tag; drop it unless a container still uses it.
    docker image rm "$old_id" >/dev/null 2>&1 || say "kept the outdated image $old_id (in use)"
fi
say "$IMAGE built in $(( $(date +%s) - started )) s ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
say "use it: CANOPY_SANDBOX_IMAGE=$IMAGE (the default of canopy up)"
