#!/usr/bin/env bash
# The project's loopback Kubernetes test cluster (v1.34.4 from dev/k8s/build-bins.sh).
#
#   bash dev/k8s/cluster.sh up DIR            # etcd, apiserver, controller-manager, scheduler, fake node
#   bash dev/k8s/cluster.sh up-real-node DIR  # plus containerd + kubelet (node "localhost", tainted)
#   bash dev/k8s/cluster.sh status DIR        # exit 0 when every recorded process runs and /readyz is ok
#   bash dev/k8s/cluster.sh down DIR          # stops what DIR records, by PID only
#
# `up` writes DIR/kubeconfig (admin bearer token, system:masters; CA file DIR/pki/ca.crt),
# prints progress on stderr and `SANDHUB_TEST_KUBECONFIG=DIR/kubeconfig` and `K8S_BIN=...`
# on stdout. Running `up` on a DIR whose cluster runs is a no-op; leftovers of a dead one
# are stopped first, and every `up` starts from an empty etcd.
#
# Env: K8S_BIN (default: from build-bins.sh, which builds once), FAKE_NODE_BIN (default:
# the cargo target dir's debug/sandhub-fake-node, built if missing), FAKE_NODES (how many
# fake nodes, default 1: fake-node-0 with pods from 10.244.0.0/16, fake-node-1 from
# 10.245.0.0/16, ...; FAKE_NODE=0 means none), ETCD_PORT, API_PORT (default: free ports), CLUSTER_TIMEOUT (seconds per wait, 90),
# API_EXTRA_ARGS (appended to kube-apiserver's flags).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/../.." && pwd)"
cmd="${1:-}"
[[ -n "$cmd" && -n "${2:-}" ]] || {
    echo "usage: $0 up|up-real-node|status|down DIR" >&2
    exit 2
}
mkdir -p "$2"
dir="$(cd "$2" && pwd)"
run="$dir/run"   # PID files: "PID EXECUTABLE"
logs="$dir/logs"
timeout="${CLUSTER_TIMEOUT:-90}"
t0=$(date +%s%N)
umask 077 # the kubeconfig and pki hold the admin token and keys

log() {
    local ms=$((($(date +%s%N) - t0) / 1000000))
    printf 'cluster: [%3d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}
die() {
    echo "cluster: ERROR: $*" >&2
    exit 1
}

# ---------------------------------------------------------------- processes by PID
# A PID file names the executable too, so a PID the kernel reused for something else is
# never signalled.
start() { # NAME BINARY ARGS...
    local name="$1"
    shift
    "$@" >"$logs/$name.log" 2>&1 &
    echo "$! $(readlink -f "$1")" >"$run/$name.pid"
}

pid_of() { # NAME -> PID when it runs the recorded executable
    local f="$run/$1.pid" pid exe actual
    [[ -f "$f" ]] || return 1
    read -r pid exe <"$f"
    actual="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
    [[ "${actual% (deleted)}" == "$exe" ]] || return 1
    echo "$pid"
}

alive() { pid_of "$1" >/dev/null; }

# An exited process stays a zombie until init reaps it, which here can take seconds.
running() { [[ -e "/proc/$1" ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

stop() { # NAMES... : TERM all, wait up to 10s, then KILL
    local name pid pids=()
    for name in "$@"; do
        if pid="$(pid_of "$name")"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for _ in $(seq 1 100); do
        local left=()
        for pid in "${pids[@]}"; do running "$pid" && left+=("$pid"); done
        ((${#left[@]})) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    for name in "$@"; do rm -f "$run/$name.pid"; done
}

wait_for() { # WHAT PROCESS-NAME COMMAND... : until COMMAND succeeds, the process dies, or timeout
    local what="$1" name="$2"
    shift 2
    local deadline=$(($(date +%s) + timeout))
    until "$@" >/dev/null 2>&1; do
        if ! alive "$name"; then
            tail -n 25 "$logs/$name.log" >&2 || true
            die "$name exited while waiting for $what (log: $logs/$name.log)"
        fi
        if (($(date +%s) > deadline)); then
            tail -n 25 "$logs/$name.log" >&2 || true
            die "$what not reached after ${timeout}s (log: $logs/$name.log)"
        fi
        sleep 0.1
    done
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---------------------------------------------------------------- API access with curl
api_get() { # PATH
    curl -sf --max-time 5 --cacert "$dir/pki/ca.crt" -H "Authorization: Bearer $(cat "$dir/pki/admin.token")" \
        "https://127.0.0.1:$(cat "$dir/api.port")$1"
}
api_ready() { [[ "$(api_get /readyz)" == ok ]]; }
node_ready() { # NODE
    api_get "/api/v1/nodes/$1" | python3 -c '
import json, sys
conds = json.load(sys.stdin).get("status", {}).get("conditions", [])
sys.exit(0 if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else 1)'
}
healthz() { [[ "$(curl -sfk --max-time 2 "https://127.0.0.1:$1/healthz")" == ok ]]; }

# ---------------------------------------------------------------- pieces of `up`
fake_node_count() {
    if [[ "${FAKE_NODE:-1}" == 0 ]]; then echo 0; else echo "${FAKE_NODES:-1}"; fi
}

recorded_fake_nodes() { # names of the fake nodes DIR has PID files for
    local f
    for f in "$run"/fake-node*.pid; do [[ -e "$f" ]] && basename "$f" .pid; done
    return 0
}

find_bins() {
    if [[ -z "${K8S_BIN:-}" ]]; then
        K8S_BIN="$(SANDHUB_CACHE="${SANDHUB_CACHE:-}" bash "$here/build-bins.sh" | sed -n 's/^K8S_BIN=//p' | tail -n1)"
    fi
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler; do
        [[ -x "$K8S_BIN/$b" ]] || die "$K8S_BIN/$b missing (run bash dev/k8s/build-bins.sh)"
    done
    local n
    n="$(fake_node_count)"
    [[ "$n" =~ ^[0-9]+$ ]] && ((n <= 10)) || die "FAKE_NODES must be 0..10 (got $n)"
    if ((n > 0)) && [[ -z "${FAKE_NODE_BIN:-}" ]]; then
        local target="${CARGO_TARGET_DIR:-$repo_root/target}"
        [[ "$target" = /* ]] || target="$repo_root/$target"
        FAKE_NODE_BIN="$target/debug/sandhub-fake-node"
        if [[ ! -x "$FAKE_NODE_BIN" ]]; then
            log "building sandhub-fake-node"
            (cd "$repo_root" && cargo build -q -p sandhub-testkit --bin sandhub-fake-node) >&2
        fi
    fi
}

make_pki() {
    local p="$dir/pki"
    [[ -f "$p/admin.token" && -f "$p/apiserver.crt" && -f "$p/sa.pub" ]] && return 0
    log "making certificates"
    rm -rf "$p"
    mkdir -p "$p"
    (
        cd "$p"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
            -subj "/CN=sandhub-test-ca" 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
            -subj "/CN=kube-apiserver" 2>/dev/null
        cat >apiserver.ext <<'EXT'
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
EXT
        openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt \
            -days 3650 -extfile apiserver.ext 2>/dev/null
        openssl genrsa -out sa.key 2048 2>/dev/null
        openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
        openssl rand -hex 24 >admin.token
        echo "$(cat admin.token),admin,admin-uid,system:masters" >tokens.csv
    )
}

write_kubeconfig() {
    cat >"$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandhub-test
  cluster:
    server: https://127.0.0.1:$(cat "$dir/api.port")
    certificate-authority: $dir/pki/ca.crt
users:
- name: admin
  user:
    token: $(cat "$dir/pki/admin.token")
contexts:
- name: sandhub-test
  context: {cluster: sandhub-test, user: admin, namespace: default}
current-context: sandhub-test
KC
}

start_etcd() {
    local port="${ETCD_PORT:-$(free_port)}" peer
    peer="$(free_port)"
    echo "$port" >"$dir/etcd.port"
    rm -rf "$dir/etcd" # every up starts from an empty store
    # No fsync: a throwaway test store, and fsync dominates write latency on a busy disk.
    # A single member has no peers to wait for: short election timing makes it leader at once.
    start etcd "$K8S_BIN/etcd" --name test --data-dir "$dir/etcd" --unsafe-no-fsync --log-level warn \
        --heartbeat-interval 20 --election-timeout 200 \
        --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "test=http://127.0.0.1:$peer"
}

start_apiserver() {
    local port="${API_PORT:-$(free_port)}"
    echo "$port" >"$dir/api.port"
    # ServiceAccount admission is off: Pods need no token volume and no race with the
    # serviceaccount controller in fresh namespaces. TaintNodesByCondition is off: nodes
    # report Ready themselves and the nodelifecycle controller (which would lift the taint)
    # does not run.
    # shellcheck disable=SC2086 # API_EXTRA_ARGS is split on purpose
    start kube-apiserver "$K8S_BIN/kube-apiserver" \
        --etcd-servers="http://127.0.0.1:$(cat "$dir/etcd.port")" \
        --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" \
        --cert-dir="$dir/pki" --tls-cert-file="$dir/pki/apiserver.crt" --tls-private-key-file="$dir/pki/apiserver.key" \
        --client-ca-file="$dir/pki/ca.crt" --token-auth-file="$dir/pki/tokens.csv" \
        --authorization-mode=RBAC --anonymous-auth=false \
        --service-account-key-file="$dir/pki/sa.pub" --service-account-signing-key-file="$dir/pki/sa.key" \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true \
        --disable-admission-plugins=ServiceAccount,TaintNodesByCondition \
        --kubelet-preferred-address-types=Hostname,InternalIP \
        --profiling=false \
        ${API_EXTRA_ARGS:-}
}

start_controllers() {
    local cm_port sched_port
    cm_port="$(free_port)"
    sched_port="$(free_port)"
    echo "$cm_port" >"$dir/controller-manager.port"
    echo "$sched_port" >"$dir/scheduler.port"
    # nodeipam and nodelifecycle are off: fake nodes bring their own pod CIDR, and must
    # never be tainted or have their Pods evicted.
    start kube-controller-manager "$K8S_BIN/kube-controller-manager" --kubeconfig="$dir/kubeconfig" \
        --leader-elect=false --bind-address=127.0.0.1 --secure-port="$cm_port" --cert-dir="$dir/pki/controller-manager" \
        --controllers='*,-node-ipam-controller,-node-lifecycle-controller' \
        --service-account-private-key-file="$dir/pki/sa.key" --root-ca-file="$dir/pki/ca.crt" \
        --use-service-account-credentials=false --kube-api-qps=500 --kube-api-burst=1000
    cat >"$dir/scheduler.yaml" <<YAML
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $dir/kubeconfig
  qps: 500
  burst: 1000
leaderElection:
  leaderElect: false
YAML
    start kube-scheduler "$K8S_BIN/kube-scheduler" --config="$dir/scheduler.yaml" \
        --bind-address=127.0.0.1 --secure-port="$sched_port" --cert-dir="$dir/pki/scheduler"
}

start_fake_nodes() {
    local i
    for ((i = 0; i < $(fake_node_count); i++)); do
        start "fake-node-$i" "$FAKE_NODE_BIN" --kubeconfig "$dir/kubeconfig" --node-name "fake-node-$i" \
            --pod-cidr "10.$((244 + i)).0.0/16"
    done
}

cluster_running() {
    local n
    for n in etcd kube-apiserver kube-controller-manager kube-scheduler; do alive "$n" || return 1; done
    local i
    for ((i = 0; i < $(fake_node_count); i++)); do alive "fake-node-$i" || return 1; done
    api_ready
}

report() {
    echo "SANDHUB_TEST_KUBECONFIG=$dir/kubeconfig"
    echo "K8S_BIN=$K8S_BIN"
}

up() {
    mkdir -p "$run" "$logs"
    find_bins
    if cluster_running 2>/dev/null; then
        log "already up in $dir"
        report
        return 0
    fi
    # shellcheck disable=SC2046 # one name per line
    stop $(recorded_fake_nodes) kubelet kube-scheduler kube-controller-manager kube-apiserver etcd # leftovers of a dead run
    make_pki
    log "starting etcd"
    start_etcd
    wait_for "etcd health" etcd curl -sf --max-time 2 "http://127.0.0.1:$(cat "$dir/etcd.port")/health"
    log "etcd ready on 127.0.0.1:$(cat "$dir/etcd.port"); starting kube-apiserver"
    start_apiserver
    write_kubeconfig
    wait_for "apiserver /readyz" kube-apiserver api_ready
    log "kube-apiserver ready on https://127.0.0.1:$(cat "$dir/api.port"); starting controller-manager, scheduler"
    start_controllers
    start_fake_nodes
    wait_for "controller-manager /healthz" kube-controller-manager healthz "$(cat "$dir/controller-manager.port")"
    wait_for "scheduler /healthz" kube-scheduler healthz "$(cat "$dir/scheduler.port")"
    local i
    for ((i = 0; i < $(fake_node_count); i++)); do
        wait_for "node fake-node-$i Ready" "fake-node-$i" node_ready "fake-node-$i"
    done
    log "cluster up in $dir (kubeconfig $dir/kubeconfig)"
    report
}

status() {
    local rc=0 n pid
    for n in etcd kube-apiserver kube-controller-manager kube-scheduler $(recorded_fake_nodes) containerd kubelet; do
        [[ -f "$run/$n.pid" ]] || continue
        if pid="$(pid_of "$n")"; then echo "$n: running (pid $pid)"; else echo "$n: NOT running"; rc=1; fi
    done
    if [[ -f "$dir/api.port" ]] && api_ready; then echo "apiserver: ready (https://127.0.0.1:$(cat "$dir/api.port"))"; else
        echo "apiserver: not ready"
        rc=1
    fi
    return "$rc"
}

down() {
    [[ -d "$run" ]] || return 0
    if declare -F stop_real_node >/dev/null; then stop_real_node; fi
    # shellcheck disable=SC2046 # one name per line
    stop $(recorded_fake_nodes) kubelet kube-scheduler kube-controller-manager kube-apiserver
    stop etcd # last: the others' shutdown may still talk to it
    stop containerd
    log "down ($dir)"
}

# shellcheck source=dev/k8s/real-node.sh
[[ -f "$here/real-node.sh" ]] && source "$here/real-node.sh"

case "$cmd" in
    up) up ;;
    up-real-node)
        up
        up_real_node
        ;;
    status) status ;;
    down) down ;;
    *)
        echo "usage: $0 up|up-real-node|status|down DIR" >&2
        exit 2
        ;;
esac
