#!/usr/bin/env bash
# A real OCI registry (CNCF distribution v3) on loopback, for the tests of the hub's image
# store, and the test images to push into it. Test infrastructure only (Go builds it).
#
#   registry.sh build                              build registry + htpasswd into $SANDHUB_CACHE/registry/bin
#   registry.sh up DIR [--auth USER:PASS]          start one on 127.0.0.1:<free port>; prints ADDR=127.0.0.1:PORT
#   registry.sh down DIR                           stop it (its data, config and log stay)
#   registry.sh push DIR LAYOUT REPO:TAG [--ref NAME] [--auth USER:PASS]
#                                                  push an OCI layout's image (index.json entry whose
#                                                  org.opencontainers.image.ref.name is NAME, default REPO:TAG)
#   registry.sh build-test-image [OUT_DIR]         build the test images' OCI layout (cached); prints its
#                                                  JSON summary; copies the layout to OUT_DIR when given
#   registry.sh build-bench-image pull|shared [ARGS]
#                                                  build the benchmarks' layouts (bench_image.py, cached in
#                                                  $SANDHUB_CACHE/registry/bench); prints their JSON summary
#
# `up` writes DIR/config.yml (filesystem storage in DIR/data, deletes enabled, htpasswd auth
# with --auth), DIR/pid (the registry leads its own process group), DIR/registry.log and,
# once GET /v2/ answers (200, or 401 with --auth), DIR/addr. A second `up` of a running
# DIR prints its address and changes nothing.
# Env: SANDHUB_CACHE (default ~/.cache/sandhub), REGISTRY_VERSION (default v3.0.0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${SANDHUB_CACHE:-${HOME:-/root}/.cache/sandhub}"
REGISTRY_VERSION="${REGISTRY_VERSION:-v3.0.0}"
bin_dir="$cache/registry/bin"
registry_bin="$bin_dir/registry"
htpasswd_bin="$bin_dir/htpasswd"
STARTUP_TIMEOUT_S=30

log() { echo "registry: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { sed -n '5,15s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }

find_go() {
    if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
        export PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null 2>&1 || die "go not found: install Go >= 1.23 (https://go.dev/dl) to build the test registry"
}

htpasswd_fresh() {
    [[ -x "$htpasswd_bin" && "$htpasswd_bin" -nt "$here/htpasswd/main.go" && "$htpasswd_bin" -nt "$here/htpasswd/go.mod" ]]
}

cmd_build() {
    if [[ -x "$registry_bin" && "$(cat "$bin_dir/.registry-version" 2>/dev/null)" == "$REGISTRY_VERSION" ]] \
        && htpasswd_fresh; then
        log "up to date: $registry_bin ($REGISTRY_VERSION)"
        echo "REGISTRY_BIN=$registry_bin"
        return
    fi
    mkdir -p "$bin_dir"
    # One build at a time per cache (test-deps.sh and a manual run may race).
    exec 9>"$bin_dir/.build.lock"
    flock -n 9 || { log "another build is running; waiting for it"; flock 9; }
    find_go
    export CGO_ENABLED=0 GOFLAGS="-buildvcs=false"
    if [[ ! -x "$registry_bin" || "$(cat "$bin_dir/.registry-version" 2>/dev/null)" != "$REGISTRY_VERSION" ]]; then
        log "go install github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION (a minute or two on a fresh machine)"
        rm -f "$bin_dir/.registry-version"
        GOBIN="$bin_dir" go install "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
        echo "$REGISTRY_VERSION" >"$bin_dir/.registry-version"
    fi
    if ! htpasswd_fresh; then
        log "building the bcrypt htpasswd helper (dev/registry/htpasswd)"
        (cd "$here/htpasswd" && GOBIN="$bin_dir" go install .)
        mv "$bin_dir/registry-htpasswd" "$htpasswd_bin"
    fi
    echo "REGISTRY_BIN=$registry_bin"
}

# pid of a running registry of DIR, or nothing.
running_pid() {
    local dir=$1 pid
    [[ -f "$dir/pid" ]] || return 0
    pid="$(cat "$dir/pid")"
    # The pid is still this DIR's registry (not a reused pid): its command line names DIR's config.
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
        && [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *" serve $dir/config.yml "* ]]; then
        echo "$pid"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# HTTP status of GET http://ADDR/v2/ [with Basic USER:PASS] (000 when nothing answers).
v2_status() {
    local creds=()
    [[ -z "${2:-}" ]] || creds=(-u "$2")
    curl -s -o /dev/null -m 2 -w '%{http_code}' "${creds[@]}" "http://$1/v2/" || true
}

cmd_up() {
    local dir="" auth=""
    while (($#)); do
        case "$1" in
            --auth) [[ $# -ge 2 ]] || usage; auth="$2"; shift 2 ;;
            -*) usage ;;
            *) [[ -z "$dir" ]] || usage; dir="$1"; shift ;;
        esac
    done
    [[ -n "$dir" ]] || usage
    [[ -x "$registry_bin" ]] || die "no registry binary at $registry_bin: run \`bash dev/registry/registry.sh build\`"
    if [[ -n "$auth" ]]; then
        [[ "$auth" == *:* && -n "${auth%%:*}" ]] || die "--auth wants USER:PASS"
        [[ -x "$htpasswd_bin" ]] || die "no htpasswd helper at $htpasswd_bin: run \`bash dev/registry/registry.sh build\`"
    fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"

    local pid
    pid="$(running_pid "$dir")"
    if [[ -n "$pid" ]]; then
        [[ -f "$dir/addr" ]] || die "a registry (pid $pid) runs for $dir but $dir/addr is missing: \`registry.sh down $dir\` first"
        [[ "$(v2_status "$(cat "$dir/addr")" "$auth")" == 200 ]] \
            || die "the registry running for $dir (pid $pid) has other auth settings than asked: \`registry.sh down $dir\` first"
        log "already running (pid $pid) at $(cat "$dir/addr")"
        echo "ADDR=$(cat "$dir/addr")"
        return
    fi
    rm -f "$dir/pid" "$dir/addr"
    mkdir -p "$dir/data"

    local auth_yaml="" user pass
    if [[ -n "$auth" ]]; then
        user="${auth%%:*}" pass="${auth#*:}"
        (umask 077 && "$htpasswd_bin" "$user" "$pass" >"$dir/htpasswd")
        auth_yaml="auth:
  htpasswd:
    realm: sandhub-test-registry
    path: \"$dir/htpasswd\""
    else
        rm -f "$dir/htpasswd"
    fi

    local attempt port status waited log_start
    for attempt in 1 2 3 4 5; do
        port="$(free_port)"
        cat >"$dir/config.yml" <<YAML
# Written by dev/registry/registry.sh up: a test registry on loopback, no TLS.
version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: "$dir/data"
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:$port
  secret: sandhub-test-registry-$port
$auth_yaml
YAML
        log_start="$(stat -c %s "$dir/registry.log" 2>/dev/null || echo 0)"
        # setsid without a fork (a background job of a non-interactive shell is no group
        # leader): $! is the registry, leader of its own group. OTEL off: no exporter dials out.
        OTEL_SDK_DISABLED=true OTEL_TRACES_EXPORTER=none \
            setsid "$registry_bin" serve "$dir/config.yml" </dev/null >>"$dir/registry.log" 2>&1 &
        pid=$!
        echo "$pid" >"$dir/pid"
        waited=0
        while :; do
            status="$(v2_status "127.0.0.1:$port")"
            if [[ "$status" == 200 && -z "$auth" ]] || [[ "$status" == 401 && -n "$auth" ]]; then
                echo "127.0.0.1:$port" >"$dir/addr"
                log "up (pid $pid) at 127.0.0.1:$port${auth:+ with htpasswd auth}, data in $dir/data"
                echo "ADDR=127.0.0.1:$port"
                return
            fi
            if ! kill -0 "$pid" 2>/dev/null; then
                rm -f "$dir/pid"
                if tail -c "+$((log_start + 1))" "$dir/registry.log" | grep -q 'address already in use'; then
                    log "port $port was taken before the registry bound it (attempt $attempt); retrying"
                    continue 2
                fi
                die "the registry exited at start; $dir/registry.log ends: $(tail -n 20 "$dir/registry.log")"
            fi
            if ((waited >= STARTUP_TIMEOUT_S * 10)); then
                kill -KILL -- "-$pid" 2>/dev/null || true
                rm -f "$dir/pid"
                die "no answer from GET http://127.0.0.1:$port/v2/ within ${STARTUP_TIMEOUT_S}s (last status $status); see $dir/registry.log"
            fi
            sleep 0.1
            waited=$((waited + 1))
        done
    done
    die "could not bind a free port in 5 attempts; see $dir/registry.log"
}

cmd_down() {
    [[ $# -eq 1 ]] || usage
    local dir=$1 pid i
    [[ -d "$dir" ]] || { log "not running: no directory $dir"; return; }
    dir="$(cd "$dir" && pwd)"
    pid="$(running_pid "$dir")"
    if [[ -z "$pid" ]]; then
        log "not running: $dir"
        rm -f "$dir/pid" "$dir/addr"
        return
    fi
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "pid $pid ignored SIGTERM for 10s; killing its process group"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/pid" "$dir/addr"
    log "stopped (pid $pid)"
}

cmd_push() {
    local args=() dir
    (($# >= 3)) || usage
    dir=$1
    [[ -f "$dir/addr" ]] || die "no $dir/addr: is a registry up for $dir (\`registry.sh up $dir\`)?"
    args=(--addr "$(cat "$dir/addr")" --layout "$2" --target "$3")
    shift 3
    python3 "$here/push.py" "${args[@]}" "$@"
}

cmd_build_bench_image() {
    (($# >= 1)) || usage
    python3 "$here/bench_image.py" --cache "$cache/registry" "$@"
}

cmd_build_test_image() {
    (($# <= 1)) || usage
    python3 "$here/test_image.py" --cache "$cache/registry" ${1:+--out "$1"}
}

(($#)) || usage
sub=$1
shift
case "$sub" in
    build) (($# == 0)) || usage; cmd_build ;;
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    push) cmd_push "$@" ;;
    build-test-image) cmd_build_test_image "$@" ;;
    build-bench-image) cmd_build_bench_image "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
