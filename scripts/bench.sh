#!/usr/bin/env bash
# Builds the release binaries and runs one benchmark suite. The first
# argument may name the suite (`sandboxd`, the default, `hub`, `router`, `controller` or
# `replicas`); every
# other argument is passed through to `sandhub-bench <suite>` (see its
# --help), e.g.
#
#   bash scripts/bench.sh
#   bash scripts/bench.sh --json --exec-iterations 500 --file-size-mib 64
#   bash scripts/bench.sh hub
#   bash scripts/bench.sh hub --phases warm,exec --warm-claims 50
#   bash scripts/bench.sh controller --claims 300   # starts a test cluster unless --kubeconfig
#   bash scripts/bench.sh router --connections 10,50,200 --duration-secs 4
#   bash scripts/bench.sh replicas --replicas 1,2,4 --clients 64   # starts a cluster with the real node
#
# Env: CARGO_TARGET_DIR (cargo's; also where the bench finds sandboxd and
# sandhub), and every SANDHUB_BENCH_* variable the bench's flags read.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1 && [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

suite=sandboxd
case "${1:-}" in
    sandboxd | hub | router | controller | replicas)
        suite=$1
        shift
        ;;
esac

# Build output goes to stderr, so `--json` output on stdout stays parseable.
case "$suite" in
    sandboxd) cargo build --release -p sandboxd -p sandhub-bench >&2 ;;
    hub) cargo build --release -p sandhub -p sandhub-bench >&2 ;;
    controller) cargo build --release -p sandhub-controller -p sandhub-bench >&2 ;;
    router) cargo build --release -p sandhub-router -p sandhub-bench >&2 ;;
    replicas) cargo build --release -p sandhub -p sandhub-controller -p sandhub-bench >&2 ;;
esac
exec "${CARGO_TARGET_DIR:-target}/release/sandhub-bench" "$suite" "$@"
