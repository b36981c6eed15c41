#!/usr/bin/env bash
# Every adapter benchmark against one release hub: each framework's overhead on `true`
# (bench/adapters/overhead.py, in that framework's venv; OpenHands: bench/adapters/openhands.py)
# and the Gymnasium vector env's
# throughput with 8 and 64 envs (bench/adapters/vector.py).
#
#   bash bench/adapters/run.sh            # after bash scripts/test-deps.sh made the venvs
#
# Env: CARGO_TARGET_DIR (where the release `sandhub` is built), SANDHUB_CACHE (the venvs,
# as scripts/test-deps.sh), SANDHUB_BENCH_RUNS (calls per series, default 300).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
cache="${SANDHUB_CACHE:-$HOME/.cache/sandhub}"
if ! command -v cargo >/dev/null 2>&1 && [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
cargo build --release -p sandhub >&2
sandhub="${CARGO_TARGET_DIR:-target}/release/sandhub"
[[ "$sandhub" = /* ]] || sandhub="$repo_root/$sandhub"

state="$(mktemp -d)"
port=$("$cache/venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$sandhub" serve --listen "127.0.0.1:$port" --state-dir "$state/state" >"$state/hub.log" 2>&1 &
hub_pid=$!
trap 'kill $hub_pid 2>/dev/null; wait $hub_pid 2>/dev/null; rm -rf "$state"' EXIT
export SANDHUB_URL="http://127.0.0.1:$port"
until curl -sf "$SANDHUB_URL/readyz" >/dev/null; do
    kill -0 $hub_pid 2>/dev/null || { cat "$state/hub.log" >&2; exit 1; }
    sleep 0.1
done

runs=${SANDHUB_BENCH_RUNS:-300}
for entry in deepagents:venv-deepagents nemo-gym:venv-nemo-gym gymnasium:venv deerflow:venv-deerflow; do
    framework=${entry%%:*} python="$cache/${entry#*:}/bin/python"
    if [[ ! -x "$python" ]]; then
        echo "$framework: no venv at $python (bash scripts/test-deps.sh)" >&2
        continue
    fi
    "$python" bench/adapters/overhead.py "$framework" --runs "$runs"
done
# OpenHands needs its agent server started in a sandbox: its own script starts its own hub
# (host network allowed) and imports the agent-server image.
if [[ -x "$cache/venv-openhands/bin/python" ]]; then
    SANDHUB_BIN="$sandhub" "$cache/venv-openhands/bin/python" bench/adapters/openhands.py --connection proxy
else
    echo "openhands: no venv at $cache/venv-openhands (bash scripts/test-deps.sh)" >&2
fi
"$cache/venv/bin/python" bench/adapters/vector.py --envs 8,64
