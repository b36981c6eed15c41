#!/usr/bin/env bash
# The one test command: Rust format/lint/build/tests, then the Python suite that
# drives the real sandboxd binary through the unmodified upstream Python SDK.
#
#   bash scripts/test.sh
#
# Env: CARGO_TARGET_DIR (cargo's), SANDHUB_CACHE (venv location, see
# scripts/test-deps.sh), SANDBOXD_BIN (defaults to the binary this run builds),
# CI=true (nothing may be skipped; the python suite turns a missing binary
# into a failure), PYTEST_ARGS (extra pytest arguments, e.g. "-k legacy").
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

step="start"
started=$SECONDS
on_exit() {
    local rc=$?
    if ((rc != 0)); then
        echo "test.sh: FAILED at step '$step' (exit $rc) after $((SECONDS - started))s" >&2
    fi
}
trap on_exit EXIT

run_step() {
    step="$1"
    shift
    echo
    echo "==> [$step] $*"
    "$@"
}

if ! command -v cargo >/dev/null 2>&1 && [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

# ---------------------------------------------------------------- dependencies
step="deps"
echo "==> [deps] bash scripts/test-deps.sh"
deps_out="$(bash scripts/test-deps.sh)"
venv_python="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_PYTHON=//p' | tail -n1)"
if [[ -z "$venv_python" || ! -x "$venv_python" ]]; then
    echo "test.sh: scripts/test-deps.sh did not report a usable python ($venv_python)" >&2
    exit 1
fi

# ---------------------------------------------------------------- Rust
run_step fmt cargo fmt --all -- --check
run_step build cargo build --workspace --all-targets
run_step clippy cargo clippy --workspace --all-targets -- -D warnings
run_step cargo-test cargo test --workspace

# ---------------------------------------------------------------- Python
target_dir="${CARGO_TARGET_DIR:-target}"
[[ "$target_dir" = /* ]] || target_dir="$repo_root/$target_dir"
export SANDBOXD_BIN="${SANDBOXD_BIN:-$target_dir/debug/sandboxd}"
if [[ ! -x "$SANDBOXD_BIN" ]]; then
    echo "test.sh: sandboxd binary not found at $SANDBOXD_BIN after the build" >&2
    exit 1
fi

step="pytest"
echo
echo "==> [pytest] SANDBOXD_BIN=$SANDBOXD_BIN $venv_python -m pytest tests/python -v"
set +e
# shellcheck disable=SC2086 # PYTEST_ARGS is split on purpose
PYTHONDONTWRITEBYTECODE=1 "$venv_python" -m pytest tests/python -v -rs -p no:cacheprovider ${PYTEST_ARGS:-}
pytest_rc=$?
set -e
case "$pytest_rc" in
    0) ;;
    5)
        echo "test.sh: pytest collected no tests (exit 5); treating that as a failure" >&2
        exit 1
        ;;
    *) exit "$pytest_rc" ;;
esac

step="done"
echo
echo "test.sh: all checks passed (fmt, build, clippy, cargo test, pytest) in $((SECONDS - started))s"
