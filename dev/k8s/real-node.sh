# shellcheck shell=bash
# Real-node mode of dev/k8s/cluster.sh (sourced by it; uses its helpers): Debian's
# containerd + runc + CNI bridge plugins and the v1.34.4 kubelet, registered as node
# "localhost" with the taint sandhub.dev/real-node=true:NoSchedule and the label
# sandhub.dev/real-node=true, so only Pods that tolerate the taint and select the label
# run there. Images come from dev/k8s/build-image.sh (no registry): the pause image and
# sandhub/sandboxd:dev.
#
# Needs root and: apt-get install containerd runc containernetworking-plugins busybox-static

REAL_NODE_NAME=localhost
REAL_NODE_TAINT="sandhub.dev/real-node=true:NoSchedule"
REAL_NODE_LABEL="sandhub.dev/real-node=true"
PAUSE_IMAGE="registry.k8s.io/pause:3.10"
CNI_BRIDGE=cni-test0
CNI_SUBNET=10.88.0.0/16

ctr_() { ctr --address "$dir/containerd/containerd.sock" -n k8s.io "$@"; }

up_real_node() {
    [[ "$(id -u)" == 0 ]] || die "the real node needs root (containerd, runc, network namespaces)"
    local b
    for b in containerd ctr runc; do
        command -v "$b" >/dev/null || die "$b missing: apt-get install containerd runc containernetworking-plugins"
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] ||
        die "CNI plugins missing: apt-get install containernetworking-plugins"
    [[ -x "$K8S_BIN/kubelet" ]] || die "$K8S_BIN/kubelet missing (run bash dev/k8s/build-bins.sh)"
    if alive containerd && alive kubelet && node_ready "$REAL_NODE_NAME" 2>/dev/null; then
        log "real node already up"
        return 0
    fi
    stop_real_node
    # host-local IPAM state is per DIR, so real nodes of several clusters on this machine
    # (they share the bridge) each take their own /24 slice of the subnet, chosen by the
    # apiserver's (random free) port; .0.x stays for the bridge's gateway address.
    local slice=$(($(cat "$dir/api.port") % 250 + 1))

    local c="$dir/containerd"
    mkdir -p "$c" "$dir/cni/net.d" "$dir/cni/ipam" "$dir/kubelet"
    # Everything containerd keeps lives under DIR (pod network namespaces too); the sandbox forbids negative
    # oom_score_adj (runc fails with "can't get final child's PID from pipe: EOF" without
    # restrict_oom_score_adj); crun does not work under this cgroup hybrid mode, runc does.
    containerd config default |
        sed -e "s#^root = .*#root = \"$c/root\"#" \
            -e "s#^state = .*#state = \"$c/state\"#" \
            -e "s#address = \"/run/containerd/containerd.sock\"#address = \"$c/containerd.sock\"#" \
            -e "s#bin_dir = \"/opt/cni/bin\"#bin_dir = \"/usr/lib/cni\"#" \
            -e "s#conf_dir = \"/etc/cni/net.d\"#conf_dir = \"$dir/cni/net.d\"#" \
            -e "s#restrict_oom_score_adj = false#restrict_oom_score_adj = true#" \
            -e "s#netns_mounts_under_state_dir = false#netns_mounts_under_state_dir = true#" \
            -e "s#sandbox_image = \".*\"#sandbox_image = \"$PAUSE_IMAGE\"#" >"$c/config.toml"
    grep -q "restrict_oom_score_adj = true" "$c/config.toml" || die "containerd config: restrict_oom_score_adj not set"
    cat >"$dir/cni/net.d/10-sandhub-test.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "sandhub-test", "plugins": [
  {"type": "bridge", "bridge": "$CNI_BRIDGE", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam", "ranges": [[{"subnet": "$CNI_SUBNET",
     "rangeStart": "10.88.$slice.1", "rangeEnd": "10.88.$slice.254", "gateway": "10.88.0.1"}]]}},
  {"type": "loopback"}]}
CNI

    log "starting containerd"
    start containerd "$(command -v containerd)" --config "$c/config.toml"
    wait_for "containerd socket" containerd ctr_ version

    log "importing images"
    SANDHUB_CACHE="${SANDHUB_CACHE:-}" bash "$here/build-image.sh" --cluster "$dir" pause ${REAL_NODE_IMAGES-sandboxd} >&2

    local port healthz
    port="$(free_port)"
    healthz="$(free_port)"
    cat >"$dir/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
containerRuntimeEndpoint: unix://$c/containerd.sock
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# No container filesystem stats here (cAdvisor sees no containerd containers, /stats/summary
# lists no pods), so the kubelet could not evict for ephemeral storage anyway: the fake node
# writes that eviction for the tests (annotation sandhub.dev/fake-node-fail: Evicted).
localStorageCapacityIsolation: false
podLogsDir: $dir/kubelet/pod-logs
tlsCertFile: $dir/pki/apiserver.crt
tlsPrivateKeyFile: $dir/pki/apiserver.key
registerWithTaints:
- {key: sandhub.dev/real-node, value: "true", effect: NoSchedule}
YAML
    # The kubelet adds iptables chains to the host (KUBE-FIREWALL's rule puts every packet
    # on the host's loopback through conntrack); remember whether they were ours to remove.
    # With iptables-nft, the tables those chains go in may be new too: their names are kept.
    if ! iptables -S KUBE-FIREWALL >/dev/null 2>&1; then
        : >"$dir/kubelet/iptables-ours"
        if command -v nft >/dev/null; then nft list tables >"$dir/kubelet/nft-tables-before" 2>/dev/null || true; fi
    fi
    log "starting kubelet (node $REAL_NODE_NAME)"
    # --hostname-override=localhost with the apiserver's
    # --kubelet-preferred-address-types=Hostname,InternalIP makes logs and exec reach the
    # kubelet on loopback.
    start kubelet "$K8S_BIN/kubelet" --config="$dir/kubelet/config.yaml" --kubeconfig="$dir/kubeconfig" \
        --root-dir="$dir/kubelet/root" --hostname-override="$REAL_NODE_NAME" \
        --node-labels="$REAL_NODE_LABEL"
    wait_for "node $REAL_NODE_NAME Ready" kubelet node_ready "$REAL_NODE_NAME"
    log "real node $REAL_NODE_NAME Ready (taint $REAL_NODE_TAINT, pod IPs 10.88.$slice.0/24)"
}

# Removes the chains the kubelet added to the host's iptables, when this DIR's kubelet made
# them and no other kubelet runs: KUBE-FIREWALL left behind costs every packet on the host's
# loopback a conntrack lookup, long after the tests (the port-proxy bench's hub, on the host,
# paid it; the router it is compared with, inside the sandbox's namespace, did not).
drop_kubelet_iptables() {
    [[ -f "$dir/kubelet/iptables-ours" ]] || return 0
    local ipt t ch p
    # Another cluster's kubelet still uses them (ours may linger as a zombie: not counted).
    for p in $(pgrep -x kubelet); do running "$p" && return 0; done
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null || continue
        for ch in INPUT OUTPUT; do
            while "$ipt" -D "$ch" -j KUBE-FIREWALL 2>/dev/null; do :; done
        done
        for t in filter nat mangle; do
            for ch in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
                "$ipt" -t "$t" -F "$ch" 2>/dev/null && "$ipt" -t "$t" -X "$ch" 2>/dev/null
            done
        done
    done
    drop_new_empty_nft_tables
    rm -f "$dir/kubelet/iptables-ours" "$dir/kubelet/nft-tables-before"
}

# iptables-nft made tables and base chains to hang those rules from, and a base chain keeps its
# hook once empty: every packet on the host still walks it. A table that was not there before
# this DIR's kubelet started and holds no rule now is deleted; any other is left as it is.
drop_new_empty_nft_tables() {
    local before="$dir/kubelet/nft-tables-before" family name
    command -v nft >/dev/null && [[ -f "$before" ]] || return 0
    while read -r _ family name; do
        grep -qxF "table $family $name" "$before" && continue
        # Only the table's and chains' own lines (and blank ones): no rule in it.
        if ! nft list table "$family" "$name" 2>/dev/null \
            | grep -qvE '^[[:space:]]*(table .*\{|chain .*\{|type .*;|\}|)[[:space:]]*$'; then
            nft delete table "$family" "$name" 2>/dev/null || true
        fi
    done < <(nft list tables 2>/dev/null)
}

stop_real_node() {
    local sock="$dir/containerd/containerd.sock" t
    # Pod containers first: once containerd is gone nobody would reap them.
    if alive containerd && [[ -S "$sock" ]]; then
        stop kubelet
        for t in $(ctr_ tasks ls -q 2>/dev/null); do
            ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
        done
        # Tear the pod sandboxes down through the CRI so CNI releases addresses and netns.
        for t in $(ctr_ containers ls -q 2>/dev/null); do
            ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true
        done
    fi
    stop kubelet containerd
    drop_kubelet_iptables
    # The kubelet mounts volumes and containerd its snapshots under DIR: unmount them so
    # DIR can be removed.
    local m
    for m in $(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}
