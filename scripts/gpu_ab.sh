#!/usr/bin/env bash
# A/B of environment settings on one synthetic model's batch-1 decode, on a GPU host:
# for each setting, the engine's own decode step (mla-e2e, MLA_E2E_TIME) and `mlaserve bench`
# at batch 1 with every process marking its steps (MLA_STEP_TRACE, common/steptrace.h), read by
# scripts/steptrace.py into where each step's time goes between the caller and the engine.
# Env: BUNDLE (release tree, default .bundle), OUT (default ./out), FAMILY (default v2lite),
# LAYERS (default 4), CTX (default 1024),
# STEPS (default 64), SETTINGS: settings separated by ';',
# each a space-separated list of NAME=VALUE (default "MLA_CUDA_GRAPHS=0;MLA_CUDA_GRAPHS=1").
# The model is mkmodel's, as scripts/gpu_bench.sh writes it (reused when it is there). A dry run
# without a GPU: BUNDLE=<dir with bin/mlaserve> BACKEND=cpu MKMODEL_ARGS=--small BENCH_DIR=/tmp/x
# CTX=32 STEPS=8 scripts/gpu_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
B="$(cd "${BUNDLE:-.bundle}" && pwd)"
W="${BENCH_DIR:-/tmp/mla-bench}"
mkdir -p "$W"
F="${FAMILY:-v2lite}"
L="${LAYERS:-4}"
M="$W/${F}-${L}l-q4k.gguf"
[ -s "$M" ] || "$B/bin/mlaserve" mkmodel --family "$F" --layers "$L" --mix q4k --split-size 0 ${MKMODEL_ARGS:-} -o "$M" \
  >"$OUT/mkmodel-$F.log" 2>&1 || { tail -5 "$OUT/mkmodel-$F.log"; exit 1; }
echo "11 22 33 44 55 66 77 88" >"$W/tok8.txt"
IFS=';' read -r -a sets <<<"${SETTINGS:-MLA_CUDA_GRAPHS=0;MLA_CUDA_GRAPHS=1}"
i=0
for s in "${sets[@]}"; do
  i=$((i + 1))
  read -r -a kv <<<"$s"
  echo "== $F, setting $i: ${s:-(none)}"
  if [ -x build-gpu-carried/mla-e2e ]; then
    echo "mla-e2e: $(env "${kv[@]}" MLA_E2E_TIME=1 timeout 120 build-gpu-carried/mla-e2e logits -m "$M" --split \
      --tokens "$W/tok8.txt" --out "$W/l8.f32" --greedy 64 --ids-out "$W/ids8.txt" 2>&1 | grep -E 'timing' | tr '\n' ' ')"
  fi
  T="$OUT/trace-$F-$i"
  rm -rf "$T"
  mkdir -p "$T"
  envs=()
  for e in "${kv[@]}"; do envs+=(--env "$e"); done
  env "${kv[@]}" MLA_STEP_TRACE="$T" timeout 120 "$B/bin/mlaserve" bench -m "$M" --backend "${BACKEND:-cuda}" --tp 1 \
    --prefill none --batch 1 --ctx "${CTX:-1024}" --steps "${STEPS:-64}" --warmup 4 --cuda-precision split \
    "${envs[@]}" --md "$T/bench.md" >"$T/bench.log" 2>&1 ||
    { echo "bench: exit status $?"; tail -5 "$T/bench.log"; }
  grep '^| 1 ' "$T/bench.md" 2>/dev/null
  python3 scripts/steptrace.py "$T" --skip 4
done
