#!/usr/bin/env bash
# The one test command: Rust format/lint/build/tests, then the Python suite that
# drives the real sandboxd binary through the unmodified upstream Python SDK.
#
#   bash scripts/test.sh
#
# Env: CARGO_TARGET_DIR (cargo's), SANDHUB_CACHE (venv location, see
# scripts/test-deps.sh), SANDBOXD_BIN (defaults to the binary this run builds),
# CI=true (nothing may be skipped; the python suite turns a missing binary
# into a failure), PYTEST_ARGS (extra pytest arguments, e.g. "-k legacy"),
# SANDHUB_TEST_CLUSTER=0 (outside CI: no Kubernetes test cluster; its tests skip),
# SANDHUB_TEST_REAL_NODE=0 (outside CI: no real node, i.e. kubelet + containerd; it is
# started when running as root, and always under CI=true).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

step="start"
started=$SECONDS
log_dir="$(mktemp -d)"
cluster_dir=""
on_exit() {
    local rc=$?
    if [[ -n "$cluster_dir" ]]; then
        bash dev/k8s/cluster.sh down "$cluster_dir" || true
        if ((rc != 0)); then
            echo "test.sh: test cluster logs kept in $cluster_dir/logs" >&2
        else
            rm -rf "$cluster_dir"
        fi
    fi
    rm -rf "$log_dir"
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
deepagents_python="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_DEEPAGENTS_PYTHON=//p' | tail -n1)"
nemo_gym_python="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_NEMO_GYM_PYTHON=//p' | tail -n1)"
e2b_python="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_E2B_PYTHON=//p' | tail -n1)"
e2b_legacy_python="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_E2B_LEGACY_PYTHON=//p' | tail -n1)"
deerflow_python="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_DEERFLOW_PYTHON=//p' | tail -n1)"
openhands_python="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_OPENHANDS_PYTHON=//p' | tail -n1)"
# The OpenHands agent-server image (an OCI layout) its tests and example import into their hub.
SANDHUB_OPENHANDS_IMAGE="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_OPENHANDS_IMAGE=//p' | tail -n1)"
export SANDHUB_OPENHANDS_IMAGE
# The code-interpreter image (an OCI layout) hub/tests/code.rs imports into its hub.
SANDHUB_CODE_INTERPRETER_IMAGE="$(printf '%s\n' "$deps_out" | sed -n 's/^SANDHUB_CODE_INTERPRETER_IMAGE=//p' | tail -n1)"
export SANDHUB_CODE_INTERPRETER_IMAGE
if [[ -z "$venv_python" || ! -x "$venv_python" || -z "$deepagents_python" || ! -x "$deepagents_python" \
    || -z "$nemo_gym_python" || ! -x "$nemo_gym_python" || -z "$e2b_python" || ! -x "$e2b_python" \
    || -z "$e2b_legacy_python" || ! -x "$e2b_legacy_python" || -z "$deerflow_python" || ! -x "$deerflow_python" \
    || -z "$openhands_python" || ! -x "$openhands_python" ]]; then
    echo "test.sh: scripts/test-deps.sh did not report usable pythons ($venv_python, $deepagents_python, $nemo_gym_python, $e2b_python, $e2b_legacy_python, $deerflow_python, $openhands_python)" >&2
    exit 1
fi

# sandboxd's code-interpreter tests start kernels with the main venv's ipykernel.
export SANDHUB_CODE_PYTHON="$venv_python"
# tests/python/test_examples.py runs each framework's example with that framework's python.
export SANDHUB_DEEPAGENTS_PYTHON="$deepagents_python" SANDHUB_NEMO_GYM_PYTHON="$nemo_gym_python" \
    SANDHUB_DEERFLOW_PYTHON="$deerflow_python" SANDHUB_OPENHANDS_PYTHON="$openhands_python"

# ---------------------------------------------------------------- Rust
run_step fmt cargo fmt --all -- --check
run_step build cargo build --workspace --all-targets
run_step clippy cargo clippy --workspace --all-targets -- -D warnings
# ---------------------------------------------------------------- test cluster
# One loopback Kubernetes (etcd, apiserver, controller-manager, scheduler, fake node) for
# the whole run; tests find it through SANDHUB_TEST_KUBECONFIG and isolate themselves in
# fresh namespaces. Down again at exit (trap above).
step="cluster-up"
if [[ "${SANDHUB_TEST_CLUSTER:-1}" == 0 && "${CI:-}" != true ]]; then
    echo "test.sh: SANDHUB_TEST_CLUSTER=0: no test cluster; its tests skip" >&2
else
    cluster_dir="$(mktemp -d "${TMPDIR:-/tmp}/sandhub-k8s.XXXXXX")"
    echo
    echo "==> [cluster-up] bash dev/k8s/cluster.sh up $cluster_dir"
    if cluster_out="$(bash dev/k8s/cluster.sh up "$cluster_dir")"; then
        SANDHUB_TEST_KUBECONFIG="$(printf '%s\n' "$cluster_out" | sed -n 's/^SANDHUB_TEST_KUBECONFIG=//p')"
        K8S_BIN="$(printf '%s\n' "$cluster_out" | sed -n 's/^K8S_BIN=//p')"
        export SANDHUB_TEST_KUBECONFIG K8S_BIN
        # The cluster's own kubectl (same version as the apiserver) comes first, so
        # tests never pick up whatever kubectl the machine happens to have.
        if [[ -n "$K8S_BIN" ]]; then export PATH="$K8S_BIN:$PATH"; fi
    elif [[ "${CI:-}" == true ]]; then
        echo "test.sh: the test cluster did not start (CI=true: that fails the run)" >&2
        exit 1
    else
        echo "test.sh: WARNING: the test cluster did not start; tests needing it skip" >&2
    fi

    # The real node (kubelet + containerd + runc running our sandboxd image) joins the same
    # cluster: a few seconds once its image is built (the first build compiles a static
    # sandboxd in release mode).
    want_real_node="${SANDHUB_TEST_REAL_NODE:-1}"
    unset SANDHUB_TEST_REAL_NODE
    if [[ -n "${SANDHUB_TEST_KUBECONFIG:-}" && ("${CI:-}" == true || ("$want_real_node" != 0 && $(id -u) == 0)) ]]; then
        step="real-node-up"
        echo
        echo "==> [real-node-up] bash dev/k8s/cluster.sh up-real-node $cluster_dir"
        if bash dev/k8s/cluster.sh up-real-node "$cluster_dir" >/dev/null; then
            export SANDHUB_TEST_REAL_NODE=1
        elif [[ "${CI:-}" == true ]]; then
            echo "test.sh: the real node did not start (CI=true: that fails the run)" >&2
            exit 1
        else
            echo "test.sh: WARNING: the real node did not start; its tests skip" >&2
        fi
    fi
fi

step="cargo-test"
echo
echo "==> [cargo-test] cargo test --workspace"
cargo test --workspace 2>&1 | tee "$log_dir/cargo-test.log"
# "test result: ok. 12 passed; 0 failed; 1 ignored; ..." once per test binary.
read -r cargo_passed cargo_failed cargo_ignored < <(
    sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' \
        "$log_dir/cargo-test.log" | awk '{p+=$1; f+=$2; i+=$3} END {print p+0, f+0, i+0}'
)

# ---------------------------------------------------------------- Python
# mypy --strict over the SDK, every integrations/*/ package and tests/support (the list
# and the per-module settings are in mypy.ini).
run_step mypy "$venv_python" -m mypy --config-file mypy.ini

step="locate-sandboxd"
target_dir="${CARGO_TARGET_DIR:-target}"
[[ "$target_dir" = /* ]] || target_dir="$repo_root/$target_dir"
export SANDBOXD_BIN="${SANDBOXD_BIN:-$target_dir/debug/sandboxd}"
export SANDHUB_BIN="${SANDHUB_BIN:-$target_dir/debug/sandhub}"
export SANDHUB_CONTROLLER_BIN="${SANDHUB_CONTROLLER_BIN:-$target_dir/debug/sandhub-controller}"
export SANDHUB_MCP_BIN="${SANDHUB_MCP_BIN:-$target_dir/debug/sandhub-mcp}"
export SANDHUB_ROUTER_BIN="${SANDHUB_ROUTER_BIN:-$target_dir/debug/sandhub-router}"
if [[ ! -x "$SANDBOXD_BIN" ]]; then
    echo "test.sh: sandboxd binary not found at $SANDBOXD_BIN after the build" >&2
    exit 1
fi

step="pytest"
echo
# A suite is "dir" (the main venv) or "dir|python|pytest args" (a framework's own venv).
python_suites=(tests/python mcp-server/tests/python router/tests/python tests/k8s_e2e controller/tests/python
    # The RL fleet (sandhub-rl) against a real hub; its 200-row run is marked `scale` and included.
    integrations/rl/tests
    "integrations/deepagents/tests|$deepagents_python|-o asyncio_mode=auto"
    "integrations/nemo_gym/tests|$nemo_gym_python|-o asyncio_mode=auto"
    # DeerFlow's own sandbox tools (harness from the vendored tarball) through SandhubSandboxProvider.
    "integrations/deerflow/tests|$deerflow_python"
    # OpenHands' RemoteWorkspace and a full Conversation on an agent server inside a sandbox.
    "integrations/openhands/tests|$openhands_python|-o asyncio_mode=auto"
    # The real e2b SDK against `sandhub serve --e2b` (the E2B facade).
    "tests/e2b|$e2b_python|-o asyncio_mode=auto"
    # An e2b SDK from before 2.51 (POST /sandboxes, /sandboxes/{id}/connect) against the same facade.
    "tests/e2b_legacy|$e2b_legacy_python|-o asyncio_mode=auto")
echo "==> [pytest] SANDBOXD_BIN=$SANDBOXD_BIN SANDHUB_BIN=$SANDHUB_BIN pytest ${python_suites[*]%%|*} -v"
# One pytest process per suite: each suite has its own conftest.py and
# helper modules, and in one process the first suite's modules of the same
# name would shadow the later suites'.
junit_files=()
for entry in "${python_suites[@]}"; do
    IFS='|' read -r suite suite_python suite_args <<<"$entry"
    suite_python="${suite_python:-$venv_python}"
    junit="$log_dir/pytest-${#junit_files[@]}.xml"
    junit_files+=("$junit")
    set +e
    # shellcheck disable=SC2086 # PYTEST_ARGS is split on purpose
    PYTHONDONTWRITEBYTECODE=1 "$suite_python" -m pytest "$suite" -v -rs \
        --junitxml="$junit" ${suite_args:-} ${PYTEST_ARGS:-}
    pytest_rc=$?
    set -e
    case "$pytest_rc" in
        0) ;;
        5)
            echo "test.sh: pytest collected no tests in $suite (exit 5); treating that as a failure" >&2
            exit 1
            ;;
        *) exit "$pytest_rc" ;;
    esac
done

# pytest's totals from its JUnit reports: "passed failed skipped".
read -r py_passed py_failed py_skipped < <("$venv_python" - "${junit_files[@]}" <<'PY'
import sys
import xml.etree.ElementTree as ET

tests = failed = skipped = 0
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests += sum(int(s.get("tests", 0)) for s in suites)
    failed += sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped += sum(int(s.get("skipped", 0)) for s in suites)
print(tests - failed - skipped, failed, skipped)
PY
)

step="done"
echo
echo "test.sh: all checks passed (fmt, build, clippy, cargo test: $cargo_passed passed, pytest: $py_passed passed) in $((SECONDS - started))s"
echo "summary: $((cargo_passed + py_passed)) passed, $((cargo_failed + py_failed)) failed, $((cargo_ignored + py_skipped)) skipped"
