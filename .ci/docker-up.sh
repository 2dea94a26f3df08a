#!/usr/bin/env bash
# Bring up a Docker engine and the offline sandbox test image. Idempotent: every step
# checks first and says what it did or why it skipped.
#
#   bash .ci/docker-up.sh
#
# Env: CANOPY_SANDBOX_IMAGE (default canopy-sandbox:latest), DOCKERD_LOG (default
# /var/log/canopy-dockerd.log). Needs root (apt-get, dockerd).
#
# The engine runs with vfs storage, no iptables and no default bridge because CI machines
# are VMs/containers without overlayfs or netfilter; sandbox containers therefore use
# network_mode "none" (or "host" when a tree is allowed network). There is no container
# registry here, so the image is a busybox-static rootfs imported from a tarball.
set -euo pipefail

IMAGE="${CANOPY_SANDBOX_IMAGE:-canopy-sandbox:latest}"
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/canopy-dockerd.log}"
WAIT_SECONDS=60
# Bump when the rootfs recipe changes: an image with another version is rebuilt.
IMAGE_VERSION=3

say() { echo "docker-up: $*"; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    # The static build specifically: the image has no libc for a dynamic busybox to load.
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" ||
        missing+=(busybox-static)
    if [ ${#missing[@]} -eq 0 ]; then
        say "packages present (dockerd, busybox)"
        return
    fi
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Bounded: a daemon that is stopped or hung accepts the connection and never replies.
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

# Whether process $1 is program $2 and not a zombie that its parent has yet to reap.
runs_as() {
    [ "$(cat "/proc/$1/comm" 2>/dev/null || true)" = "$2" ] &&
        ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# An engine killed without its shutdown (the machine's processes killed between sessions, an
# OOM kill) leaves its pid file behind, and dockerd refuses to start while it exists. The file
# is stale unless the process it names is still the same program.
remove_stale_pid_file() {
    local file="$1" program="$2" pid
    [ -f "$file" ] || return 0
    pid="$(cat "$file" 2>/dev/null || true)"
    if [ -n "$pid" ] && runs_as "$pid" "$program"; then
        return 0
    fi
    say "removing stale $file (pid ${pid:-none} is not a running $program)"
    rm -f "$file"
}

# Until the engine answers, up to $1 seconds; the seconds waited on stdout.
wait_for_engine() {
    local start=$SECONDS
    until engine_answers; do
        [ $((SECONDS - start)) -lt "$1" ] || return 1
        sleep 1
    done
    echo $((SECONDS - start))
}

# A dockerd that runs but never answers (hung in its shutdown when the machine's processes were
# stopped) holds the pid file and the socket: stopped, so that a new one can start. Succeeds only
# when a running dockerd came to answer after all.
running_engine_answers() {
    pgrep -x dockerd >/dev/null || return 1
    say "a dockerd runs but does not answer; waiting up to ${WAIT_SECONDS}s for it"
    wait_for_engine "$WAIT_SECONDS" >/dev/null && return 0
    say "stopping the dockerd that does not answer"
    pkill -TERM -x dockerd || true
    local waited=0
    while pgrep -x dockerd >/dev/null && [ "$waited" -lt 15 ]; do
        sleep 1
        waited=$((waited + 1))
    done
    pkill -KILL -x dockerd || true
    pkill -KILL -x containerd || true
    sleep 1
    return 1
}

start_engine() {
    if engine_answers; then
        say "engine already answers"
        return
    fi
    if running_engine_answers; then
        say "engine answers"
        return
    fi
    remove_stale_pid_file /var/run/docker.pid dockerd
    remove_stale_pid_file /var/run/docker/containerd/containerd.pid containerd
    say "starting dockerd (vfs, no iptables, no bridge); log: $DOCKERD_LOG"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    # setsid + nohup: the engine must outlive this script and the CI step that ran it.
    setsid nohup dockerd --storage-driver=vfs --iptables=false --ip6tables=false --bridge=none \
        >>"$DOCKERD_LOG" 2>&1 </dev/null &
    local waited
    if ! waited="$(wait_for_engine "$WAIT_SECONDS")"; then
        say "engine did not answer within ${WAIT_SECONDS}s; last log lines:"
        tail -n 30 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
    say "engine answers after ${waited}s"
}

# A minimal rootfs: busybox applets (sh, sleep, kill, setsid, ...) linked into /bin.
make_rootfs() {
    local rootfs="$1"
    mkdir -p "$rootfs"/{bin,etc,dev,proc,sys,root,workspace,usr} "$rootfs/tmp"
    chmod 1777 "$rootfs/tmp"
    cp /bin/busybox "$rootfs/bin/busybox"
    # Same links as `busybox --install -s`, but relative, so they resolve inside the image
    # whatever path the host binary had.
    local applet
    for applet in $("$rootfs/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
    done
    # Debian's busybox-static has no nohup applet; agents start servers with it.
    if [ ! -e "$rootfs/bin/nohup" ]; then
        printf '#!/bin/sh\ntrap "" HUP\nexec "$@"\n' >"$rootfs/bin/nohup"
        chmod 755 "$rootfs/bin/nohup"
    fi
    ln -sfn bin "$rootfs/sbin"
    ln -sfn ../bin "$rootfs/usr/bin"
    ln -sfn ../bin "$rootfs/usr/sbin"
    # canopy (10001) is the default CANOPY_SANDBOX_USER of a root runtime: commands never run as
    # root, and a named user keeps tools that look themselves up (id, whoami) happy. Its home is
    # /tmp, the one writable place besides /workspace on the read-only root filesystem.
    printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'canopy:x:10001:10001:canopy sandbox:/tmp:/bin/sh' \
        'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$rootfs/etc/passwd"
    printf '%s\n' 'root:x:0:' 'canopy:x:10001:' 'nogroup:x:65534:' >"$rootfs/etc/group"
}

build_image() {
    local have
    have="$(docker image inspect -f '{{index .Config.Labels "canopy.image-version"}}' "$IMAGE" 2>/dev/null || true)"
    if [ "$have" = "$IMAGE_VERSION" ]; then
        say "image $IMAGE present (version $IMAGE_VERSION)"
        return
    fi
    say "building $IMAGE offline from busybox-static"
    local old_id workdir
    old_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
    workdir="$(mktemp -d)"
    make_rootfs "$workdir/rootfs"
    tar --numeric-owner --owner=0 --group=0 -C "$workdir/rootfs" -c . |
        docker import \
            --change 'CMD ["sleep", "infinity"]' \
            --change 'WORKDIR /workspace' \
            --change 'ENV PATH=/bin:/usr/bin:/sbin:/usr/sbin' \
            --change "LABEL canopy.image-version=$IMAGE_VERSION" \
            - "$IMAGE" >/dev/null
    rm -rf "$workdir"
    if [ -n "$old_id" ]; then
        # The outdated image lost its tag; drop it unless a container still uses it.
        docker image rm "$old_id" >/dev/null 2>&1 || say "kept outdated image $old_id (in use)"
    fi
    say "image $IMAGE version $IMAGE_VERSION built ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
}

install_packages
start_engine
build_image
say "ready: $(docker version -f 'server {{.Server.Version}}, API {{.Server.APIVersion}}')"
