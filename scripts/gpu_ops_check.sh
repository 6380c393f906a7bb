#!/usr/bin/env bash
# Start-up on a GPU host, from the bundle: `mlaserve serve` without --backend on a real-width
# 4-layer synthetic file (mkmodel, written here) must pick CUDA, answer /health with 503 and the
# ranks' load progress while loading, then 200; /metrics must carry the build, the pool and each
# worker's device memory. Prints one line per check, "ops check: N passed, N failed" at the end.
# Env: BUNDLE (default .bundle90), BENCH_DIR (default /tmp/mla-bench), OUT (default ./out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
B="$(cd "${BUNDLE:-.bundle90}" && pwd)"
W="${BENCH_DIR:-/tmp/mla-bench}"
mkdir -p "$W"
pass=0 fail=0
chk() { if [ "$2" = 0 ]; then echo "ok: $1"; pass=$((pass + 1)); else echo "FAIL: $1"; fail=$((fail + 1)); fi; }
"$B/bin/mlaserve" --version | head -1
M="$W/v3-4l-q4k.gguf"
[ -s "$M" ] || "$B/bin/mlaserve" mkmodel --family v3 --layers 4 --mix q4k --split-size 0 -o "$M" >/dev/null 2>&1
rm -f "$W/port"
"$B/bin/mlaserve" serve -m "$M" --port 18080 --port-file "$W/port" >"$OUT/ops-serve.log" 2>&1 &
spid=$!
saw503="" ready=""
for _ in $(seq 1 600); do
  body=$(curl -s -w ' %{http_code}' http://127.0.0.1:18080/health 2>/dev/null || true)
  case "$body" in
    *" 503") [ -z "$saw503" ] && saw503="$body" ;;
    *" 200") ready=1; break ;;
  esac
  kill -0 $spid 2>/dev/null || break
  sleep 0.1
done
echo "while loading: ${saw503:0:400}"
[[ "$saw503" == *load* ]]; chk "/health answered 503 with load progress while loading" $?
[ -n "$ready" ]; chk "/health 200 once loaded" $?
grep -q "cuda model: rank 0" "$OUT/ops-serve.log"; chk "the workers picked CUDA without --backend" $?
m=$(curl -s http://127.0.0.1:18080/metrics)
echo "$m" | grep -E "^mlaserve_(build_info|worker_device_memory|kv_cache_rank_bytes|kv_cache_blocks\{)" | head -8
echo "$m" | grep -q "^mlaserve_build_info{"; chk "/metrics: build info" $?
echo "$m" | grep -qE "^mlaserve_worker_device_memory_total_bytes\{.*\} [1-9]"; chk "/metrics: the worker's device memory" $?
echo "$m" | grep -qE "^mlaserve_kv_cache_rank_bytes\{.*\} [1-9]"; chk "/metrics: the rank's pool" $?
kill -TERM $spid 2>/dev/null
wait $spid 2>/dev/null
echo "ops check: $pass passed, $fail failed"
[ "$fail" = 0 ]
