#!/usr/bin/env bash
# The REST API with curl and jq: create a sandbox, put a file, run it, read the result,
# then delete the sandbox. Every error is JSON {"code", "message"}; `curl -f` stops the
# script on one.
#
#   SANDHUB_URL=http://127.0.0.1:7070 bash examples/rest-curl/rest.sh
set -euo pipefail
hub=${SANDHUB_URL:-http://127.0.0.1:7070}
api() { curl -sSf "$@"; }

id=$(api -XPOST "$hub/v1/sandboxes" -d '{"labels":{"example":"rest-curl"}}' | jq -r .id)
trap 'api -XDELETE "$hub/v1/sandboxes/$id" >/dev/null' EXIT
echo "sandbox $id"

printf 'import sys\nprint(sum(int(x) for x in sys.argv[1:]))\n' |
    api -XPUT "$hub/v1/sandboxes/$id/files/src/add.py" --data-binary @- >/dev/null
out=$(api -XPOST "$hub/v1/sandboxes/$id/exec" -d '{"command":"python3 src/add.py 20 22 | tee sum.txt"}')
echo "exec: $out"
[[ $(jq -r .exit_code <<<"$out") == 0 ]]

sum=$(api "$hub/v1/sandboxes/$id/files/sum.txt")
echo "sum.txt: $sum"
[[ $sum == 42 ]]

# A bad request gets a clear code word, not a stack trace.
err=$(curl -sS -XPOST "$hub/v1/sandboxes/$id/exec" -d '{"command":"true","timeout_seconds":-1}')
echo "negative timeout: $err"
[[ $(jq -r .code <<<"$err") == INVALID_ARGUMENT ]]
