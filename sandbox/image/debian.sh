# Sourced by the scripts that build Canopy's images from Debian's package mirror alone
# (sandbox/image/build.sh, .ci/canopy-base.sh).
#
# Why not `docker build`: a Dockerfile starts FROM an image, and there may be no registry to pull
# one from; mmdebstrap writes a root filesystem as a tarball, which `docker import` turns into an
# image.
#
#   debian_image WHO IMAGE LABEL VERSION PACKAGES CHANGES [CUSTOMIZE]
#
# WHO prefixes the messages. PACKAGES and CHANGES name arrays: the Debian packages (on top of
# minbase) and the `docker import --change` instructions. The image is labelled LABEL=VERSION, and
# an image that already carries that label value is kept (idempotent; bump VERSION when a recipe
# changes). CUSTOMIZE is an mmdebstrap customize hook run on the root ("$1") before it is packed;
# apt's lists, caches and logs are removed after it, and so are man pages, docs (but their
# copyright files) and locales.
#
# Env: DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (http://deb.debian.org/debian),
# DEBIAN_SECURITY_MIRROR (http://deb.debian.org/debian-security). Needs root (or a user mmdebstrap
# can unshare for), `mmdebstrap` (installed with apt-get when missing and root) and a Docker engine.

debian_image() {
    local who="$1" image="$2" label="$3" version="$4" customize="${7:-}"
    local -n packages_="$5" changes_="$6"
    local suite="${DEBIAN_SUITE:-bookworm}"
    local mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    local security="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
    say() { echo "$who: $*"; }

    if [ "$(docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$image" 2>/dev/null)" = "$version" ]; then
        say "$image present (recipe version $version); nothing to do"
        return 0
    fi
    docker info >/dev/null 2>&1 || { say "no Docker engine answers: start one (bash .ci/docker-up.sh does)"; return 1; }
    if ! command -v mmdebstrap >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || { say "mmdebstrap is missing: apt-get install mmdebstrap"; return 1; }
        say "installing mmdebstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
    fi

    local change_args=() change
    for change in "${changes_[@]}"; do
        change_args+=(--change "$change")
    done
    say "building $image from Debian $suite ($mirror); packages: ${packages_[*]}"
    local started old_id
    started=$(date +%s)
    old_id="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
    mmdebstrap --quiet --variant=minbase --format=tar \
        --include="$(IFS=,; echo "${packages_[*]}")" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --aptopt='Acquire::Languages "none"' \
        ${customize:+--customize-hook="$customize"} \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log' \
        "$suite" - \
        "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main" |
        docker import "${change_args[@]}" --change "LABEL $label=$version" - "$image" >/dev/null
    if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect -f '{{.Id}}' "$image")" ]; then
        # The outdated image lost its tag; drop it unless a container or image still uses it.
        docker image rm "$old_id" >/dev/null 2>&1 || say "kept the outdated image $old_id (in use)"
    fi
    say "$image built in $(( $(date +%s) - started )) s ($(docker image inspect -f '{{.Size}}' "$image") bytes)"
}
