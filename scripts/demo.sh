#!/usr/bin/env bash
# `make run`: starts mlaserve on the bundled tiny model (2 tensor-parallel worker processes on
# the CPU), asks it "What is 7 plus 5?" through the OpenAI chat API with curl, prints the answer
# and stops the server. Usage: scripts/demo.sh BUILD_DIR MODEL
set -euo pipefail
build=${1:-build}
model=${2:-models/tiny-deepseek3-bf16.gguf}
exe="$build/coordinator/mlaserve"
portfile=$(mktemp)
log=$(mktemp)
rm -f "$portfile"

"$exe" inspect "$model" | head -2
echo
echo "+ $exe serve -m $model --tp 2 --port 0   (log: $log)"
"$exe" serve -m "$model" --tp 2 --port 0 --port-file "$portfile" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$portfile"' EXIT
for _ in $(seq 1 150); do
  [[ -s "$portfile" ]] && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "demo: the server exited" >&2; exit 1; }
  sleep 0.2
done
[[ -s "$portfile" ]] || { cat "$log"; echo "demo: the server did not start in 30 s" >&2; exit 1; }
port=$(cat "$portfile")
req='{"messages":[{"role":"user","content":"What is 7 plus 5?"}],"max_tokens":32}'
echo "+ curl http://127.0.0.1:$port/v1/chat/completions -d '$req'"
reply=$(curl -sS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$req")
echo "$reply"
answer=$(printf '%s' "$reply" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
echo
echo "answer: $answer"
echo
echo "To keep a server running: $exe serve -m $model --tp 2 --port 8080"
[[ "$answer" == *12* ]]
