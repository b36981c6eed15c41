#!/usr/bin/env bash
# Builds the real node's container images as OCI archives (no registry, no Docker daemon)
# and optionally imports them into a test cluster's containerd (namespace k8s.io).
#
#   bash dev/k8s/build-image.sh [--cluster DIR] [pause] [sandboxd]    # default: both
#
#   pause     PAUSE_IMAGE (default registry.k8s.io/pause:3.10): a tiny static C program
#             that sleeps until signalled and reaps children; the pod sandbox image.
#   sandboxd  (docker.io/)sandhub/sandboxd:dev: a statically linked sandboxd (release build, glibc
#             crt-static, in its own target subdir) plus busybox-static, entrypoint sandboxd.
#
# Archives land in $SANDHUB_CACHE/k8s/images/<name>.tar and are rebuilt only when their
# input changed. Env: SANDHUB_CACHE, CARGO_TARGET_DIR, PAUSE_IMAGE, SANDBOXD_IMAGE.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/../.." && pwd)"
cache="${SANDHUB_CACHE:-${HOME:-/root}/.cache/sandhub}"
out="$cache/k8s/images"
PAUSE_IMAGE="${PAUSE_IMAGE:-registry.k8s.io/pause:3.10}"
# Fully qualified, as the CRI normalises the Pods' `sandhub/sandboxd:dev` to docker.io/...
SANDBOXD_IMAGE="${SANDBOXD_IMAGE:-docker.io/sandhub/sandboxd:dev}"
cluster=""
images=()
while (($#)); do
    case "$1" in
        --cluster) cluster="$2"; shift 2 ;;
        pause | sandboxd) images+=("$1"); shift ;;
        *) echo "usage: $0 [--cluster DIR] [pause] [sandboxd]" >&2; exit 2 ;;
    esac
done
((${#images[@]})) || images=(pause sandboxd)
mkdir -p "$out"
log() { echo "build-image: $*" >&2; }

fresh() { # ARCHIVE INPUTS... : the archive exists and is newer than every input
    local archive="$1" input
    shift
    [[ -f "$archive" ]] || return 1
    for input in "$@"; do [[ "$archive" -nt "$input" ]] || return 1; done
}

build_pause() {
    local src="$out/pause.c" archive="$out/pause.tar"
    cat >"$src.new" <<'C'
/* Pod sandbox process: holds the pod's namespaces, reaps orphans, exits on TERM/INT. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGTERM, quit);
    signal(SIGINT, quit);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
C
    cmp -s "$src.new" "$src" && rm "$src.new" || mv "$src.new" "$src"
    if fresh "$archive" "$src" "$here/oci_image.py"; then
        log "pause image up to date ($archive)"
        return
    fi
    local rootfs
    rootfs="$(mktemp -d)"
    gcc -Os -static -o "$rootfs/pause" "$src"
    python3 "$here/oci_image.py" --rootfs "$rootfs" --name "$PAUSE_IMAGE" --out "$archive" --entrypoint /pause >&2
    rm -rf "$rootfs"
}

build_sandboxd() {
    local archive="$out/sandboxd.tar" target bin busybox=/bin/busybox
    target="${CARGO_TARGET_DIR:-$repo_root/target}"
    [[ "$target" = /* ]] || target="$repo_root/$target"
    target="$target/static" # crt-static objects must not mix with the normal build's
    log "building a static sandboxd (cargo build --release -p sandboxd, crt-static)"
    # Optimised but built for test turnaround: no LTO, no debug info, more codegen units
    # than the shipping release profile (this is a test image, not a benchmark subject).
    (cd "$repo_root" && RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR="$target" \
        CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo build --release -q -p sandboxd --target x86_64-unknown-linux-gnu)
    bin="$target/x86_64-unknown-linux-gnu/release/sandboxd"
    if ldd "$bin" >/dev/null 2>&1 && ! ldd "$bin" 2>&1 | grep -q 'statically linked'; then
        log "$bin is dynamically linked"
        exit 1
    fi
    [[ -x "$busybox" ]] && "$busybox" --list >/dev/null 2>&1 || {
        log "busybox missing: apt-get install busybox-static"
        exit 1
    }
    if fresh "$archive" "$bin" "$busybox" "$here/oci_image.py" "$here/build-image.sh"; then
        log "sandboxd image up to date ($archive)"
        return
    fi
    local rootfs applet
    rootfs="$(mktemp -d)"
    mkdir -p "$rootfs"/{bin,usr/bin,usr/local/bin,etc,tmp,root,workspace}
    chmod 1777 "$rootfs/tmp"
    cp "$busybox" "$rootfs/bin/busybox"
    for applet in $("$busybox" --list); do
        [[ -e "$rootfs/bin/$applet" ]] || ln -s busybox "$rootfs/bin/$applet"
    done
    strip -o "$rootfs/usr/local/bin/sandboxd" "$bin" # the release profile keeps debug info
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
    python3 "$here/oci_image.py" --rootfs "$rootfs" --name "$SANDBOXD_IMAGE" --out "$archive" \
        --entrypoint /usr/local/bin/sandboxd >&2
    rm -rf "$rootfs"
}

for image in "${images[@]}"; do
    "build_$image"
    if [[ -n "$cluster" ]]; then
        ctr --address "$cluster/containerd/containerd.sock" -n k8s.io images import "$out/$image.tar" >/dev/null
        log "imported $image into $cluster's containerd"
    fi
    echo "IMAGE_TAR=$out/$image.tar"
done
