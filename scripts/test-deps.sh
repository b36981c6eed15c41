#!/usr/bin/env bash
# Installs what the test suite needs, idempotently.
#
#  - Debian packages (only those missing; `apt-get update` only when something
#    must be installed; needs root or sudo then).
#  - A Python virtualenv at ${SANDHUB_CACHE:-$HOME/.cache/sandhub}/venv with the
#    pins of tests/requirements.txt. A stamp file keyed on the hash of that file
#    (and the interpreter version) makes a second run a fast no-op.
#  - The repository's own Python packages (the test harness sandhub_testing, the
#    Gymnasium adapter), installed editable into that venv, so the suites import
#    them like any package and this checkout's edits count without a reinstall.
#    A second stamp, keyed on the checkout's path and the packages' pyproject.toml,
#    reinstalls them only when one of those changes.
#  - A venv per framework that pins its own stack ($SANDHUB_CACHE/venv-deepagents, venv-nemo-gym), with
#    the SDK, the adapter and the harness; its python is printed as SANDHUB_<NAME>_PYTHON=...
#    The E2B facade's suite (tests/e2b: the real `e2b` SDK against `sandhub serve --e2b`)
#    gets one the same way ($SANDHUB_CACHE/venv-e2b), from its pins alone (no adapter), and so
#    does its legacy twin (tests/e2b_legacy: an e2b SDK from before 2.51, on the pre-v2 routes;
#    $SANDHUB_CACHE/venv-e2b-legacy).
#
# Prints the venv's python path on the last line of stdout as `SANDHUB_PYTHON=...`.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req_file="$repo_root/tests/requirements.txt"
cache_dir="${SANDHUB_CACHE:-$HOME/.cache/sandhub}"
venv_dir="$cache_dir/venv"
stamp_file="$venv_dir/.sandhub-deps-stamp"

log() { echo "[test-deps] $*" >&2; }

# ---------------------------------------------------------------- Debian packages
# python3 + venv (ensurepip) for the virtualenv; a C toolchain for Rust's linker
# and build scripts; ca-certificates for pip over https; openssl and curl for the
# Kubernetes test cluster's certificates and readiness checks (dev/k8s/cluster.sh) and the
# test registry's (dev/registry/registry.sh);
# containerd, runc, the CNI plugins and busybox-static for its real node and images.
# nginx and wrk: the baseline and the load generator of the router benchmark
# (scripts/bench.sh router). jq and iproute2: the README's commands use jq, and
# tests/python/test_readme.py runs them in a network namespace of their own (ip).
# btrfs-progs: mkfs.btrfs makes the disk-quota volume every local hub keeps its
# sandboxes on (hub/src/local/quota).
# git, tmux and procps also go into the OpenHands agent-server test image (dev/openhands).
# chromium: the real browser that opens sandbox pages (Playwright drives it by
# executable_path; Playwright's own browser download is not used).
apt_packages=(python3 python3-venv gcc libc6-dev ca-certificates openssl curl nginx wrk
    containerd runc containernetworking-plugins busybox-static jq iproute2 btrfs-progs git tmux procps
    chromium)

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${apt_packages[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
else
    log "dpkg-query not found: not a Debian system, skipping apt packages"
fi

if ((${#missing[@]})); then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            log "missing Debian packages (${missing[*]}) and not root; install them and re-run"
            exit 1
        fi
    fi
    log "installing Debian packages: ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
else
    log "Debian packages present: ${apt_packages[*]}"
fi

# ---------------------------------------------------------------- Node (the web console)
# tests/python/test_console_bundle.py rebuilds console/dist/ from its source with
# the pinned lockfile (npm ci, cached by lockfile hash under $SANDHUB_CACHE). Vite
# needs Node 20.19 or newer; Debian 12's nodejs is older, so a machine without
# node gets Debian's as a last resort and that test names the version it needs.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "node/npm not found: installing Debian's nodejs and npm"
    node_sudo=()
    [[ $(id -u) -eq 0 ]] || node_sudo=(sudo)
    "${node_sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${node_sudo[@]}" apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi

# ---------------------------------------------------------------- Rust toolchain
if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found on PATH (nor in \$HOME/.cargo/bin): install a stable Rust toolchain (rustup)"
    exit 1
fi
for comp in rustfmt clippy; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
        if command -v rustup >/dev/null 2>&1; then
            log "installing rustup component $comp"
            rustup component add "$comp" >&2
        else
            log "cargo ${comp/rustfmt/fmt} not available and no rustup to add it"
            exit 1
        fi
    fi
done

# ---------------------------------------------------------------- Kubernetes test cluster
# etcd and Kubernetes v1.34.4 built from Go modules once into $SANDHUB_CACHE/k8s (minutes
# on a fresh machine, instant later). Go is test infrastructure only; 1.21+ fetches the
# toolchain Kubernetes asks for through the module proxy.
if [[ "${SANDHUB_TEST_CLUSTER:-1}" != 0 ]]; then
    if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
        export PATH="/usr/local/go/bin:$PATH"
    fi
    if ! command -v go >/dev/null 2>&1; then
        log "go not found: install Go >= 1.21 (https://go.dev/dl) to build the test cluster's binaries"
        exit 1
    fi
    log "test cluster binaries: bash dev/k8s/build-bins.sh (builds once; progress below)"
    k8s_bin="$(SANDHUB_CACHE="$cache_dir" bash "$repo_root/dev/k8s/build-bins.sh" | sed -n 's/^K8S_BIN=//p' | tail -n1)"
    [[ -n "$k8s_bin" ]] || { log "dev/k8s/build-bins.sh did not report K8S_BIN"; exit 1; }
    log "test cluster binaries in $k8s_bin"
fi

# ---------------------------------------------------------------- OCI test registry
# CNCF distribution (registry v3.0.0) and a bcrypt htpasswd helper built from Go modules
# into $SANDHUB_CACHE/registry/bin, and the registry test images (an OCI layout made from
# Debian packages fetched with apt-get download) into $SANDHUB_CACHE/registry/images: the
# image store's tests run a real registry on loopback (dev/registry/README.md). Both build
# once; later runs return at once.
if [[ "${SANDHUB_TEST_REGISTRY:-1}" != 0 ]]; then
    registry_bin="$(SANDHUB_CACHE="$cache_dir" bash "$repo_root/dev/registry/registry.sh" build \
        | sed -n 's/^REGISTRY_BIN=//p' | tail -n1)"
    [[ -n "$registry_bin" ]] || { log "dev/registry/registry.sh build did not report REGISTRY_BIN"; exit 1; }
    log "test registry: $registry_bin"
    test_layout="$(SANDHUB_CACHE="$cache_dir" bash "$repo_root/dev/registry/registry.sh" build-test-image \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["layout"])')"
    [[ -n "$test_layout" ]] || { log "dev/registry/registry.sh build-test-image did not report its layout"; exit 1; }
    log "registry test images: $test_layout"
fi

# ---------------------------------------------------------------- Python venv
# The SDK needs Python >= 3.11.
python_bin="${SANDHUB_PYTHON_BOOTSTRAP:-python3}"
if ! "$python_bin" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    log "$python_bin is older than 3.11; the k8s-agent-sandbox SDK needs >= 3.11"
    exit 1
fi

want_stamp="$( (sha256sum "$req_file" | cut -d' ' -f1; "$python_bin" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"

if [[ -x "$venv_dir/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$want_stamp" ]] \
    && "$venv_dir/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "venv up to date: $venv_dir (stamp $want_stamp)"
else
    want_version="$("$python_bin" -c 'import sys; print(sys.version)')"
    have_version="$("$venv_dir/bin/python" -c 'import sys; print(sys.version)' 2>/dev/null || true)"
    if [[ "$have_version" != "$want_version" ]]; then
        log "creating virtualenv $venv_dir with $("$python_bin" --version 2>&1) ($(command -v "$python_bin"))"
        rm -rf "$venv_dir"
        mkdir -p "$cache_dir"
        "$python_bin" -m venv "$venv_dir"
    fi
    log "installing Python packages from ${req_file#"$repo_root"/} into $venv_dir"
    "$venv_dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req_file" >&2
    "$venv_dir/bin/python" -c 'import pytest, requests, grpc, k8s_agent_sandbox' >&2
    echo "$want_stamp" >"$stamp_file"
    log "venv ready: $venv_dir"
fi

# ---------------------------------------------------------------- the sandhub Python SDK
# python/ (PyO3 + maturin) built from this checkout on every run: cargo rebuilds only
# what changed (CARGO_TARGET_DIR is honoured), and no test imports it by path. maturin
# (its build backend) comes with tests/requirements.txt. The dev profile reuses the
# dependencies the test build already compiled (pip's default, release with LTO, is
# minutes more); set MATURIN_PEP517_ARGS to override. The wheel is abi3 (CPython >= 3.11),
# so it is built once, here, and installed into every venv below (the framework venvs
# run other interpreters: building per venv would rebuild pyo3 for each).
# A directory per run: checkouts sharing one $SANDHUB_CACHE may run this at the same time.
mkdir -p "$cache_dir"
sdk_wheel_dir="$(mktemp -d "$cache_dir/sdk-wheel.XXXXXX")"
trap 'rm -rf "$sdk_wheel_dir"' EXIT
log "building the sandhub Python SDK (python/) into $sdk_wheel_dir"
PATH="$venv_dir/bin:$PATH" MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS:---profile dev}" \
    "$venv_dir/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps --wheel-dir "$sdk_wheel_dir" "$repo_root/python" >&2
sdk_wheels=("$sdk_wheel_dir"/sandhub-*.whl)
[[ ${#sdk_wheels[@]} -eq 1 && -f "${sdk_wheels[0]}" ]] || { log "no single SDK wheel in $sdk_wheel_dir"; exit 1; }
sdk_wheel="${sdk_wheels[0]}"
log "installing the sandhub Python SDK ($(basename "$sdk_wheel")) into $venv_dir"
"$venv_dir/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$sdk_wheel" >&2
"$venv_dir/bin/python" -c 'import sandhub' >&2

# ---------------------------------------------------------------- the repository's Python packages
# Editable installs point at this checkout: a venv shared by several checkouts (one
# $SANDHUB_CACHE) follows whichever ran this script last, so the stamp names the path.
local_packages=(tests/support integrations/gymnasium integrations/rl)
local_stamp_file="$venv_dir/.sandhub-local-stamp"
want_local_stamp="$( (echo "$repo_root"; for p in "${local_packages[@]}"; do
    echo "$p"; sha256sum "$repo_root/$p/pyproject.toml" | cut -d' ' -f1; done) | sha256sum | cut -d' ' -f1)"
if [[ -f "$local_stamp_file" && "$(cat "$local_stamp_file")" == "$want_local_stamp" ]] \
    && "$venv_dir/bin/python" -c 'import sandhub_testing, sandhub_gymnasium, sandhub_rl' >/dev/null 2>&1; then
    log "project packages up to date: ${local_packages[*]}"
else
    log "installing project packages (editable): ${local_packages[*]}"
    editable=()
    for p in "${local_packages[@]}"; do editable+=(-e "$repo_root/$p"); done
    "$venv_dir/bin/python" -m pip install --quiet --disable-pip-version-check "${editable[@]}" >&2
    "$venv_dir/bin/python" -c 'import sandhub_testing, sandhub_gymnasium, sandhub_rl' >&2
    echo "$want_local_stamp" >"$local_stamp_file"
fi

# ---------------------------------------------------------------- framework venvs
# An adapter whose framework pins its own stack (NeMo Gym: CPython 3.13) is tested in a
# venv of its own: the framework's pins from the adapter's tests/requirements.txt (stamped
# like the main venv's), the SDK from this checkout, and the adapter plus the test harness
# (tests/support, its plain helpers need only pytest) editable. Prints NAME_PYTHON=path.
# A test suite with no adapter of its own (tests/e2b, tests/e2b_legacy) passes its own directory: its pins
# are DIR/requirements.txt when there is no DIR/tests/requirements.txt, and without a
# DIR/pyproject.toml only the harness is installed editable.
#   framework_venv NAME ADAPTER_DIR IMPORT_CHECK PYTHON [PIP ARGS of a second, separate install]
framework_venv() {
    local name=$1 adapter=$2 import_check=$3 fw_python=$4
    shift 4
    local fw_venv="$cache_dir/venv-$name" fw_req="$repo_root/$adapter/tests/requirements.txt"
    local fw_stamp="$fw_venv/.sandhub-deps-stamp" fw_local_stamp="$fw_venv/.sandhub-local-stamp"
    local want have
    [[ -f "$fw_req" ]] || fw_req="$repo_root/$adapter/requirements.txt"
    local editable_dirs=(tests/support)
    [[ ! -f "$repo_root/$adapter/pyproject.toml" ]] || editable_dirs+=("$adapter")
    want="$( (sha256sum "$fw_req" | cut -d' ' -f1; echo "$*"; "$fw_python" -c 'import sys; print(sys.version)') \
        | sha256sum | cut -d' ' -f1)"
    if [[ -x "$fw_venv/bin/python" && -f "$fw_stamp" && "$(cat "$fw_stamp")" == "$want" ]]; then
        log "$name venv up to date: $fw_venv"
    else
        log "creating the $name venv $fw_venv ($("$fw_python" --version 2>&1)) from ${fw_req#"$repo_root"/}"
        rm -rf "$fw_venv"
        "$fw_python" -m venv "$fw_venv"
        "$fw_venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$fw_req" >&2
        if (($#)); then
            "$fw_venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2
        fi
        echo "$want" >"$fw_stamp"
    fi
    log "installing the sandhub Python SDK ($(basename "$sdk_wheel")) into $fw_venv"
    "$fw_venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$sdk_wheel" >&2
    want="$( (echo "$repo_root"; for p in "${editable_dirs[@]}"; do
        echo "$p"; sha256sum "$repo_root/$p/pyproject.toml" | cut -d' ' -f1; done) | sha256sum | cut -d' ' -f1)"
    if [[ -f "$fw_local_stamp" && "$(cat "$fw_local_stamp")" == "$want" ]] \
        && "$fw_venv/bin/python" -c "import sandhub_testing, $import_check" >/dev/null 2>&1; then
        log "$name project packages up to date"
    else
        local editable=()
        for p in "${editable_dirs[@]}"; do editable+=(-e "$repo_root/$p"); done
        "$fw_venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${editable[@]}" >&2
        "$fw_venv/bin/python" -c "import sandhub_testing, $import_check" >&2
        echo "$want" >"$fw_local_stamp"
    fi
    have="$(echo "$name" | tr '[:lower:]-' '[:upper:]_')"
    echo "SANDHUB_${have}_PYTHON=$fw_venv/bin/python"
}
framework_venv deepagents integrations/deepagents langchain_sandhub "$python_bin"
# The E2B facade's suite: e2b 2.63.0 (CPython >= 3.11) and its test pins, tests/e2b/requirements.txt.
framework_venv e2b tests/e2b e2b "$python_bin"
# The same facade driven by an SDK from before 2.51.0 (e2b 2.46.4: POST /sandboxes and
# /sandboxes/{id}/connect instead of /v2/...), pins in tests/e2b_legacy/requirements.txt.
framework_venv e2b-legacy tests/e2b_legacy e2b "$python_bin"

# The first CPython 3.X that runs, for a framework that needs that version:
# $SANDHUB_PYTHON3X, python3.X on PATH, then pyenv's versions (newest first). Each candidate is
# run, not just found: a pyenv shim is on PATH even when its version is not the active one,
# and then fails.
minor_python() {
    local want=$1 var="SANDHUB_PYTHON${1/./}" cand
    local candidates=("${!var:-}" "$(command -v "python$want" || true)")
    while IFS= read -r cand; do candidates+=("$cand"); done < <(
        ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$want"*/bin/"python$want" 2>/dev/null | sort -rV)
    for cand in "${candidates[@]}"; do
        if [[ -n "$cand" && -x "$cand" ]] && "$cand" -c "import sys; sys.exit(sys.version_info[:2] != (${want/./, }))" >/dev/null 2>&1; then
            echo "$cand"
            return 0
        fi
    done
    log "no working CPython $want found (tried: ${candidates[*]}; set $var)"
    return 1
}

# nemo-gym 0.7.0 declares Python >= 3.13.14 and a heavy dependency set (ray, mlflow, wandb);
# its sandbox API runs on any 3.13 with a few light deps, so where no 3.13.14+ exists it is
# installed with --no-deps --ignore-requires-python (its tests/requirements.txt has the rest).
nemo_python="$(minor_python 3.13)" || exit 1
framework_venv nemo-gym integrations/nemo_gym sandhub_nemo_gym "$nemo_python" \
    --no-deps --ignore-requires-python nemo-gym==0.7.0

# DeerFlow is not on the package index: its harness (dist deerflow-harness) and the
# extension-api it pins come from the vendored source tarball, installed with --no-deps
# (the harness's full dependency set took 5 min 42 s to install: markitdown[all], kubernetes,
# langgraph-api, ...); integrations/deerflow/tests/requirements.txt has the light runtime
# deps its sandbox tools import. The tarball is looked for in $SANDHUB_VENDOR_DIR, then in
# ../shared/vendor beside the checkout and /work/shared/vendor (where this machine keeps the
# project's shared files; a clone elsewhere may not have them beside it); a copy is kept in
# $cache_dir/vendor for later runs.
# Unpacked once per tarball content, to a path that names it (so the venv's stamp follows it).
# Prints the unpacked tree's root.
deerflow_source() {
    local name=deer-flow-harness.tar.gz cand tarball="" sum dir
    for cand in ${SANDHUB_VENDOR_DIR:+"$SANDHUB_VENDOR_DIR/$name"} "$repo_root/../shared/vendor/$name" \
        /work/shared/vendor/"$name" "$cache_dir/vendor/$name"; do
        if [[ -f "$cand" ]]; then tarball="$cand"; break; fi
    done
    if [[ -z "$tarball" ]]; then
        log "DeerFlow's harness source $name is not in \$SANDHUB_VENDOR_DIR, $repo_root/../shared/vendor, /work/shared/vendor or $cache_dir/vendor (set SANDHUB_VENDOR_DIR)"
        return 1
    fi
    if [[ "$tarball" != "$cache_dir/vendor/$name" ]]; then
        mkdir -p "$cache_dir/vendor"
        cp -f "$tarball" "$cache_dir/vendor/$name.tmp" && mv -f "$cache_dir/vendor/$name.tmp" "$cache_dir/vendor/$name"
    fi
    sum="$(sha256sum "$tarball" | cut -c1-16)"
    dir="$cache_dir/deer-flow-harness-$sum"
    if [[ ! -f "$dir/deer-flow/backend/packages/harness/pyproject.toml" ]]; then
        log "unpacking $tarball into $dir"
        rm -rf "$dir" "$dir.tmp"
        mkdir -p "$dir.tmp"
        tar -xzf "$tarball" -C "$dir.tmp"
        mv "$dir.tmp" "$dir"
    fi
    echo "$dir/deer-flow/backend/packages"
}
deerflow_pkgs="$(deerflow_source)"
# deerflow-harness declares Python >= 3.12.
deerflow_python="$(minor_python 3.12)" || exit 1
framework_venv deerflow integrations/deerflow sandhub_deerflow "$deerflow_python" \
    --no-deps "$deerflow_pkgs/extension-api" "$deerflow_pkgs/harness"

# openhands-sdk 1.58 needs CPython >= 3.12: the 3.12 the DeerFlow venv uses (found above).
# LiteLLM (imported by the import check) would otherwise fetch its price list from the network.
openhands_python="$deerflow_python"
LITELLM_LOCAL_MODEL_COST_MAP=True OPENHANDS_SUPPRESS_BANNER=1 \
    framework_venv openhands integrations/openhands sandhub_openhands "$openhands_python"
# The agent-server image its tests and examples/openhands import into their hub: an OCI layout
# of that Python, openhands-agent-server 1.58.2 and this machine's Debian packages (bash, git,
# tmux...), built once into $SANDHUB_CACHE/openhands (minutes; later runs return at once).
openhands_image="$(python3 "$repo_root/dev/openhands/build-image.py" --cache "$cache_dir" --python "$openhands_python" \
    | tail -n1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["layout"])')"
[[ -d "$openhands_image" ]] || { log "dev/openhands/build-image.py did not report a layout"; exit 1; }
log "OpenHands agent-server image: $openhands_image"
echo "SANDHUB_OPENHANDS_IMAGE=$openhands_image"

# The code-interpreter image (hub/tests/code.rs runs kernels in a sandbox of it): the same
# Python with ipykernel, numpy, pandas, matplotlib and bash_kernel from the package index, built once into
# $SANDHUB_CACHE/code-interpreter (about 40 s cold; later runs return at once).
code_image="$(python3 "$repo_root/dev/code-interpreter/build-image.py" --cache "$cache_dir" --python "$openhands_python" \
    | tail -n1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["layout"])')"
[[ -d "$code_image" ]] || { log "dev/code-interpreter/build-image.py did not report a layout"; exit 1; }
log "code-interpreter image: $code_image"
echo "SANDHUB_CODE_INTERPRETER_IMAGE=$code_image"

[[ -z "${k8s_bin:-}" ]] || echo "K8S_BIN=$k8s_bin"
echo "SANDHUB_PYTHON=$venv_dir/bin/python"
