#!/usr/bin/env bash
# The cache pool on a GPU, through `mlaserve serve --backend cuda` from the bundle:
#   1. pressure: tests/serve/test_serve_pool.py on the tiny-deepseek3 fixture, a pool of 6 blocks of
#      64 positions against the default pool (64 concurrent completions of up to ~180 prompt tokens
#      and 70-76 generated, equal answers)
#   2. for FAMILY in v3 glm5: a 4-layer real-width synthetic model (mkmodel, written here), the
#      server's start-up pool line, one prompt of LONG tokens (default 131072) through the HTTP API
#      (time to the first token, bench/serve_capacity.py long), and a 10-turn conversation of 1024
#      new tokens a turn with and without the prefix cache (time to the first token of each turn)
# Env: BUNDLE (default .bundle90), FIX (default .gpu-fixtures), OUT (default ./out), BENCH_DIR
# (default /tmp/mla-bench), FAMILIES (default "v3 glm5"), LONG (default 131072; 0: no long prompt),
# LONG_S (time bound of one long prompt, default 300). The conversation's token ids are drawn with
# another seed than the long prompt's, so that its first turn finds nothing cached.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B="$(cd "${BUNDLE:-.bundle90}" && pwd)"
FIX="${FIX:-.gpu-fixtures}"
W="${BENCH_DIR:-/tmp/mla-bench}"
mkdir -p "$W"
t0=$(date +%s)
since() { echo "$(( $(date +%s) - t0 )) s"; }
rc=0
echo "== pressure (tiny-deepseek3, CUDA workers)"
printf '#!/bin/sh\nexec "%s/bin/mlaserve" serve "$@"\n' "$B" >"$W/serve-cmd"
chmod +x "$W/serve-cmd"
MLASERVE_TEST_SERVE_ARGS="--backend cuda" timeout 300 python3 tests/serve/test_serve_pool.py "$W/serve-cmd" \
  "$B/bin/mlaserve-worker" "$FIX" 6 2e-2 8 70 >"$OUT/capacity-pressure.log" 2>&1 || rc=1
grep -E "blocks of|answers equal|pool A|passed|FAIL" "$OUT/capacity-pressure.log" | head -20
echo "pressure done ($(since))"
start_server() { # model, extra args...: sets PORT and SPID
  local m="$1"; shift
  rm -f "$W/port"
  "$B/bin/mlaserve" serve -m "$m" --backend cuda --port 0 --port-file "$W/port" "$@" >"$W/serve.log" 2>&1 &
  SPID=$!
  for _ in $(seq 1 900); do [ -s "$W/port" ] && break; kill -0 $SPID 2>/dev/null || break; sleep 0.2; done
  PORT=$(cat "$W/port" 2>/dev/null || echo "")
  grep -hE "cache pool|serving a context|no room" "$W/serve.log" | sed 's/^/  /' | head -4
}
stop_server() { kill -TERM "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; }
for F in ${FAMILIES:-v3 glm5}; do
  M="$W/${F}-4l-q4k.gguf"
  [ -s "$M" ] || "$B/bin/mlaserve" mkmodel --family "$F" --layers 4 --mix q4k --split-size 0 -o "$M" >"$OUT/mkmodel-$F.log" 2>&1 ||
    { echo "mkmodel $F failed: $(tail -3 "$OUT/mkmodel-$F.log")"; rc=1; continue; }
  V=$( [ "$F" = glm5 ] && echo 154880 || echo 129280 )
  echo "== $F: $M ($(du -h "$M" | cut -f1), $(since))"
  start_server "$M"
  if [ -z "$PORT" ]; then echo "  the server did not start: $(tail -5 "$W/serve.log")"; rc=1; continue; fi
  if [ "${LONG:-131072}" -gt 0 ]; then
    timeout "${LONG_S:-300}" python3 bench/serve_capacity.py long --port "$PORT" --tokens "${LONG:-131072}" --vocab "$V" \
      --seed 1 --label "$F" | tee -a "$OUT/capacity.jsonl" || { rc=1; echo "  long prompt failed: $(tail -3 "$W/serve.log")"; }
  fi
  timeout 300 python3 bench/serve_capacity.py chat --port "$PORT" --vocab "$V" --seed 2 --label "$F prefix cache" |
    tee -a "$OUT/capacity.jsonl" || rc=1
  grep -hE "^mlaserve_prefix_cache|^mlaserve_kv_cache_(blocks_total|rank_bytes)" <(curl -sf "http://127.0.0.1:$PORT/metrics") | sed 's/^/  /'
  stop_server
  start_server "$M" --no-prefix-cache
  [ -n "$PORT" ] && { timeout 300 python3 bench/serve_capacity.py chat --port "$PORT" --vocab "$V" --seed 2 --label "$F no prefix cache" |
    tee -a "$OUT/capacity.jsonl" || rc=1; }
  stop_server
  echo "$F done ($(since))"
done
exit $rc
