#!/usr/bin/env bash
# Sandhub on a Kubernetes cluster, end to end: the CRDs, the controller, a template with a
# warm pool, the hub on the kubernetes backend, then one agent's MCP session against it.
# Everything it starts runs until the script ends; then the namespace goes.
#
#   KUBECONFIG=/path/to/kubeconfig bash examples/kubernetes/install.sh
#
# Needs on PATH: kubectl, sandhub, sandhub-controller, openssl, and a python with `mcp`.
# The controller and hub run here, outside the cluster, through the kubeconfig; to run
# them in the cluster instead, see README.md "On Kubernetes" (deploy/).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${KUBECONFIG:?set KUBECONFIG to the kubeconfig of the cluster}"
ns=${SANDHUB_EXAMPLE_NAMESPACE:-sandhub-example-$RANDOM}
port=${SANDHUB_EXAMPLE_PORT:-7171}
python=${PYTHON:-python3}
work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    kubectl delete namespace "$ns" --wait=false --ignore-not-found >/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

echo "==> CRDs"
sandhub-controller crd | kubectl apply --server-side -f - >/dev/null
kubectl wait --for=condition=Established --timeout=60s \
    crd/sandboxes.agents.x-k8s.io crd/sandboxtemplates.extensions.agents.x-k8s.io \
    crd/sandboxclaims.extensions.agents.x-k8s.io crd/sandboxwarmpools.extensions.agents.x-k8s.io >/dev/null

echo "==> namespace $ns, template and warm pool"
kubectl create namespace "$ns" >/dev/null
kubectl apply -n "$ns" -f "$here/pool.yaml" >/dev/null

echo "==> the controller (one key derives each Pod's own sandboxd token, for it and the hub)"
(umask 077; openssl rand -hex 32 >"$work/sandboxd-token.key")
sandhub-controller --extensions --leader-elect=false --watch-namespace "$ns" --kubeconfig "$KUBECONFIG" \
    --metrics-bind-address 127.0.0.1:0 --health-probe-bind-address 127.0.0.1:0 \
    --sandboxd-token-key-file "$work/sandboxd-token.key" >"$work/controller.log" 2>&1 &
pids+=($!)
kubectl wait -n "$ns" sandboxwarmpool/default --for=jsonpath='{.status.readyReplicas}'=1 --timeout=180s >/dev/null

echo "==> the hub on 127.0.0.1:$port"
sandhub serve --backend kubernetes --kubeconfig "$KUBECONFIG" --namespace "$ns" --listen "127.0.0.1:$port" \
    --sandboxd-token-key-file "$work/sandboxd-token.key" >"$work/hub.log" 2>&1 &
pids+=($!)
until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/hub.log" >&2; exit 1; }
    sleep 0.2
done

echo "==> one MCP session: create a sandbox (a Pod from the warm pool), run a command, delete it"
SANDHUB_URL="http://127.0.0.1:$port" "$python" "$here/mcp_call.py"
