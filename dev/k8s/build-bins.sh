#!/usr/bin/env bash
# Builds the test cluster's binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet) and kubectl (for the README's commands, which tests/python/
# test_readme.py runs against the test cluster) from Go modules into a cache outside the
# clone, once. Later runs find them and return at once.
#
#   bash dev/k8s/build-bins.sh          # prints K8S_BIN=<dir> on its last line
#
# Env: SANDHUB_CACHE (default ~/.cache/sandhub), K8S_VERSION, ETCD_VERSION,
#      K8S_COMPONENTS (space separated; default all six).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
cache="${SANDHUB_CACHE:-${HOME:-/root}/.cache/sandhub}"
bin_dir="$cache/k8s/$K8S_VERSION/bin"
components="${K8S_COMPONENTS:-etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl}"

missing=()
for c in $components; do [[ -x "$bin_dir/$c" ]] || missing+=("$c"); done
if ((${#missing[@]} == 0)); then
    echo "K8S_BIN=$bin_dir"
    exit 0
fi

# One build at a time per cache (test-deps.sh and a manual run may race): the second
# waits, then finds the binaries.
mkdir -p "$cache/k8s/$K8S_VERSION"
exec 9>"$cache/k8s/$K8S_VERSION/.build.lock"
if ! flock -n 9; then
    echo "build-bins: another build of $K8S_VERSION is running; waiting for it" >&2
    flock 9
fi
missing=()
for c in $components; do [[ -x "$bin_dir/$c" ]] || missing+=("$c"); done
if ((${#missing[@]} == 0)); then
    echo "K8S_BIN=$bin_dir"
    exit 0
fi

command -v go >/dev/null || { echo "build-bins: go is required (only to build the test cluster)" >&2; exit 1; }
work="$cache/k8s/$K8S_VERSION/src"
mkdir -p "$work" "$bin_dir"
cd "$work"
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0

# k8s.io/kubernetes replaces every staging module with a local path, so it cannot be
# built directly: a wrapper module pins each staging module to its published v0.X.Y.
if [[ ! -f go.sum ]]; then
    echo "build-bins: resolving k8s.io/kubernetes $K8S_VERSION (progress below)" >&2
    rm -f go.mod
    go mod init sandhub.dev/k8s-test-bins >/dev/null 2>&1
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
    go mod download -x "k8s.io/kubernetes@$K8S_VERSION" 2>&1 | grep -c . >/dev/null || true
    modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
    staging_minor="v0.${K8S_VERSION#v1.}"
    for m in $(awk '/=> .\/staging/ {print $1}' "$modfile" | sort -u); do
        go mod edit -replace "$m=$m@$staging_minor"
    done
    mkdir -p etcd
    cat > etcd/main.go <<'GO'
// etcd server for the test cluster, at the version k8s.io/kubernetes itself requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
fi

# Every Kubernetes command this script builds, so that `go mod tidy` records their
# dependencies. A cache resolved before a command was added (kubectl came later) has a
# go.sum without it: the file differs, so it is rewritten and tidied again.
tools_go="//go:build tools

package tools

import (
	_ \"k8s.io/kubernetes/cmd/kube-apiserver\"
	_ \"k8s.io/kubernetes/cmd/kube-controller-manager\"
	_ \"k8s.io/kubernetes/cmd/kube-scheduler\"
	_ \"k8s.io/kubernetes/cmd/kubelet\"
	_ \"k8s.io/kubernetes/cmd/kubectl\"
)"
if [[ "$(cat tools.go 2>/dev/null)" != "$tools_go" ]]; then
    echo "build-bins: recording the commands' dependencies (go mod tidy)" >&2
    printf '%s\n' "$tools_go" >tools.go
    go mod tidy 2>&1 | tail -5 >&2
fi

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
for c in "${missing[@]}"; do
    started=$SECONDS
    echo "build-bins: building $c ($K8S_VERSION) ..." >&2
    if [[ "$c" == etcd ]]; then
        go build -ldflags "-s -w" -o "$bin_dir/.$c.tmp" ./etcd
    else
        go build -ldflags "$ldflags" -o "$bin_dir/.$c.tmp" "k8s.io/kubernetes/cmd/$c"
    fi
    mv "$bin_dir/.$c.tmp" "$bin_dir/$c"
    echo "build-bins: $c built in $((SECONDS - started))s" >&2
done
echo "K8S_BIN=$bin_dir"
