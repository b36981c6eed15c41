#!/usr/bin/env bash
# Builds the release binaries and runs the sandboxd benchmark; every argument
# is passed through to `sandhub-bench sandboxd` (see its --help), e.g.
#
#   bash scripts/bench.sh
#   bash scripts/bench.sh --json --exec-iterations 500 --file-size-mib 64
#
# Env: CARGO_TARGET_DIR (cargo's; also where the bench finds sandboxd), and
# every SANDHUB_BENCH_* variable the bench's flags read.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1 && [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

# Build output goes to stderr, so `--json` output on stdout stays parseable.
cargo build --release -p sandboxd -p sandhub-bench >&2
exec "${CARGO_TARGET_DIR:-target}/release/sandhub-bench" sandboxd "$@"
