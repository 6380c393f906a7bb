#!/usr/bin/env bash
# Structured output at batch > 1 on a GPU (docs/structured-output.md): does a row under a JSON
# schema slow the unconstrained rows that share its steps?
#   1. `mlaserve mkmodel` writes a model with a real vocabulary on this host's disk (FAMILY,
#      default v2lite at its real size and depth: 102400 tokens, a 2.5 ms step on an H200);
#   2. `mlaserve serve --backend cuda`, then bench/structured_step.py: N unconstrained rows beside
#      K json_schema rows (ROWS, CONSTRAINED), the unconstrained rows' token gap, the wall time and
#      the workers' own step time per (N, K), written to $OUT/structured-<family>.json and .md.
# Input: .bundle90/ (scripts/gpu_carry.sh). Env: BUNDLE (.bundle90), FAMILY (v2lite), LAYERS (the
# real count), ROWS (1,8,32), CONSTRAINED (0,1,4,8), KINDS (json; json,sampled adds unconstrained
# temperature-1 rows beside the free ones), TOKENS (128), MODEL_DIR (/tmp/mla-structured),
# MLASERVE (default BUNDLE/bin/mlaserve), BACKEND (cuda), MKMODEL_ARGS, AHEAD (unset: the server's
# default; e.g. off,queue: one server per value, `--step-ahead V`, on the same model, written to
# structured-<family>-ahead-V.*), SAMPLE (device: rows that are not greedy sampled on the device,
# the CUDA engine's default; host: on rank 0's host, MLA_WORKER_HOST_SAMPLE=1; e.g. host,device runs
# each mode both ways, written to ...-host.* / ...-device.*). A dry run without a GPU:
#   MLASERVE=build/coordinator/mlaserve BACKEND=cpu LAYERS=2 MKMODEL_ARGS=--small ROWS=1,2 \
#   CONSTRAINED=0,1 TOKENS=8 scripts/gpu_structured.sh
# No timing is asserted; the table is read by a person.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
MLA="${MLASERVE:-${BUNDLE:-.bundle90}/bin/mlaserve}"
[ -x "$MLA" ] || { echo "no mlaserve at $MLA" >&2; exit 2; }
FAM="${FAMILY:-v2lite}"
D="${MODEL_DIR:-/tmp/mla-structured}"
mkdir -p "$D"
M="$D/$FAM.gguf"
largs=()
[ -n "${LAYERS:-}" ] && largs=(--layers "$LAYERS")
"$MLA" mkmodel --family "$FAM" "${largs[@]}" ${MKMODEL_ARGS:-} --mix q4k --split-size 0 -o "$M" >"$OUT/structured-mkmodel.log" 2>&1 ||
  { tail -3 "$OUT/structured-mkmodel.log"; exit 1; }
rc=0
IFS=, read -r -a modes <<<"${AHEAD:-}"
[ ${#modes[@]} -eq 0 ] && modes=("")
IFS=, read -r -a samples <<<"${SAMPLE:-device}"
for mode in "${modes[@]}"; do
 for smp in "${samples[@]}"; do
  sargs=()
  tag="$FAM"
  if [ -n "$mode" ]; then
    sargs=(--step-ahead "$mode")
    tag="$FAM-ahead-$mode"
    echo "== --step-ahead $mode, sampling: $smp"
  fi
  [ -n "${SAMPLE:-}" ] && tag="$tag-$smp"
  rm -f "$D/port"
  hs=0; [ "$smp" = host ] && hs=1
  MLA_WORKER_HOST_SAMPLE=$hs "$MLA" serve -m "$M" --backend "${BACKEND:-cuda}" --port 0 --port-file "$D/port" \
    --max-seqs 64 "${sargs[@]}" >"$OUT/structured-serve.log" 2>&1 &
  srv=$!
  for _ in $(seq 1 300); do
    [ -s "$D/port" ] && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 1
  done
  if [ -s "$D/port" ]; then
    python3 bench/structured_step.py --port "$(cat "$D/port")" --rows "${ROWS:-1,8,32}" \
      --constrained "${CONSTRAINED:-0,1,4,8}" --kinds "${KINDS:-json}" --tokens "${TOKENS:-128}" \
      --json "$OUT/structured-$tag.json" >"$OUT/structured-$tag.md" 2>&1 || rc=1
    cat "$OUT/structured-$tag.md"
  else
    echo "mlaserve serve did not start"; tail -5 "$OUT/structured-serve.log"; rc=1
  fi
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  grep -h "step ahead:" "$OUT/structured-serve.log" | tail -1
 done
done
rm -f "$M"
exit $rc
