#!/usr/bin/env bash
# The one script to run on the GPU machine: configures a CUDA-only build (MLA_GPU_ONLY: common +
# kernels + the op harness; that machine has no libzmq/libuv/protobuf-c/pcre2), builds it, runs
# (C warnings that a different gcc raises in others' files do not stop it), the host check of the dequantizers and mla-gpu-check, and writes the table to $OUT (or ./out).
#   scripts/gpu_check.sh [--quick] [--sanitize] [--e2e] [--no-ops]
#       env: ARCH (default 90), BUILD (default build-gpu), FIX (fixtures, default .gpu-fixtures)
# --e2e: after the op checks, the fixtures through the CUDA forward pass (mla-e2e, driven by
# tests/model/check_logits.py with the CPU tests' bounds) at TP = 1, 2, 4 (ranks as threads
# sharing the GPU through the host collective), and a short table. Fixtures travel in .gpu-fixtures/
# (ignored; copy with scripts/gpu_fixtures.sh, carried by the run tool).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
ARCH="${ARCH:-90}"
BUILD="${BUILD:-build-gpu}"
quick=""
sanitize=0
e2e=0
ops=1
for a in "$@"; do
  case "$a" in
    --quick) quick="--quick" ;;
    --sanitize) sanitize=1 ;;
    --e2e) e2e=1 ;;
    --no-ops) ops=0 ;;
    *) echo "usage: $0 [--quick] [--sanitize] [--e2e] [--no-ops]" >&2; exit 2 ;;
  esac
done
export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu-info.txt" || true
start=$(date +%s)
cmake -S . -B "$BUILD" "${gen[@]}" -DMLA_GPU_ONLY=ON -DMLA_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS="-Wno-maybe-uninitialized" \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
"$BUILD/test_cuda_quant_host" | tail -1
rc=0
if [ "$ops" = 1 ]; then
  timeout "${OPS_S:-330}" "$BUILD/mla-gpu-check" $quick --out "$OUT/gpu-ops-table.md" >"$OUT/gpu-check.log" 2>&1 || rc=$?
  grep -E "FAIL|differ|error|mismatch" "$OUT/gpu-check.log" | head -40 || true
  if [ "$e2e" = 1 ]; then grep -E "^(mla_attn|dsa|head_matmul|moe_experts|sample|cuda_selfcheck)" "$OUT/gpu-check.log" | cut -c1-130; tail -2 "$OUT/gpu-ops-table.md" 2>/dev/null || true
  else cat "$OUT/gpu-ops-table.md" 2>/dev/null || tail -40 "$OUT/gpu-check.log"; fi
  echo "mla-gpu-check exit status $rc ($(( $(date +%s) - start )) s since start)"
fi
if [ "$e2e" = 1 ]; then
  FIX="${FIX:-.gpu-fixtures}"
  ds="$FIX/tiny-deepseek3" glm="$FIX/tiny-glm5"
  chk=(python3 tests/model/check_logits.py --mlaserve "$BUILD/mla-e2e")
  : >"$OUT/e2e.log"
  table="$OUT/e2e-table.md"
  printf "| run | result | numbers |\n|---|---|---|\n" >"$table"
  e2e_run() { # name, env, args...
    local name="$1" envs="$2"; shift 2
    local t0=$(date +%s) r=0
    echo "== $name ($envs)" >>"$OUT/e2e.log"
    env $envs timeout 120 "${chk[@]}" "$@" >"$OUT/e2e-one.log" 2>&1 || r=$?
    cat "$OUT/e2e-one.log" >>"$OUT/e2e.log"
    local tot; tot=$(grep -E "^TOTAL|ranks vs 1 rank|FAIL|failed|Error|error" "$OUT/e2e-one.log" | tr '\n' ' ' | cut -c1-400)
    local res=pass; [ $r = 0 ] || { res="FAIL($r)"; case "$name" in *--fast*) res="$res, informational";; *) rc=1;; esac; }
    printf "| %s | %s | %s (%ss) |\n" "$name" "$res" "$tot" "$(( $(date +%s) - t0 ))" >>"$table"
  }
  e2e_run "ds3 bf16 TP1 --fast (bf16 tensor cores) vs HF + greedy" "MLA_E2E_FAST=1" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "ds3 bf16 TP1 vs HF + greedy" "X=1" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "ds3 bf16 TP1 incremental == one pass" "X=1" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --prompts 0,5,8 --incremental 4 --inc-rtol 1e-4
  e2e_run "ds3 q8_0 TP1 vs HF + llama.cpp" "" --fixture "$ds" --model "$ds/tiny-deepseek3-q8_0.gguf" --hf-argmax 0.98 --hf-dlogp 0.15 --llamacpp "$ds/llamacpp_logits-q8_0.f32" --lc-dlogp 0.2
  e2e_run "ds3 q4_k_m TP1 vs HF + llama.cpp" "" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" --hf-argmax 0.95 --hf-dlogp 1.5 --llamacpp "$ds/llamacpp_logits-q4_k_m.f32" --lc-dlogp 0.5
  e2e_run "glm5 bf16 TP1 vs HF + greedy" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "glm5 bf16 TP1 --fast vs HF" "MLA_E2E_FAST=1" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01
  e2e_run "glm5 bf16 TP1 long (DSA) + greedy + incr" "X=1" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --hf-argmax 0.99 --hf-dlogp 0.05 --greedy --incremental 40 --inc-rtol 1e-4
  e2e_run "ds3 q4_k_m TP2 == TP1" "" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" --prompts 0,7 --tp 2 --tp-rtol 1e-4
  e2e_run "ds3 q4_k_m TP2 vs HF + llama.cpp" "" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" --tp 2 --hf-argmax 0.95 --hf-dlogp 1.5 --llamacpp "$ds/llamacpp_logits-q4_k_m.f32" --lc-dlogp 0.5
  e2e_run "ds3 q4_k_m TP2 --fast == TP1" "MLA_E2E_FAST=1" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" --prompts 0,7 --tp 2 --tp-rtol 1e-4
  e2e_run "ds3 bf16 TP2 vs HF + greedy" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 2 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "glm5 bf16 TP4 == TP1 + incr" "X=1" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --tp 4 --tp-rtol 1e-4 --incremental 30 --inc-rtol 1e-4
  e2e_run "ds3 bf16 TP4 vs HF + greedy" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 4 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "glm5 bf16 TP2 vs HF + greedy" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --tp 2 --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  # step timings of the tiny model (launch-bound: 4 layers of 256 wide)
  python3 -c "import json;[print(' '.join(map(str,p['tokens']))) for p in json.load(open('$ds/ref.json'))['prompts'][:3]]" >"$OUT/tok.txt"
  MLA_E2E_TIME=1 "$BUILD/mla-e2e" logits -m "$ds/tiny-deepseek3-bf16.gguf" --tokens "$OUT/tok.txt" --out "$OUT/l.f32" --greedy 24 --ids-out "$OUT/ids.txt" 2>&1 | grep timing || true
  rm -f "$OUT/l.f32"
  cat "$table"
  echo "e2e done ($(( $(date +%s) - start )) s since start)"
fi
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "compute-sanitizer memcheck (quick run, at most ${SANITIZE_S:-300} s):"
  timeout "${SANITIZE_S:-300}" compute-sanitizer --tool memcheck --print-limit 20 "$BUILD/mla-gpu-check" --quick \
    >"$OUT/memcheck.log" 2>&1 || echo "(memcheck run ended with status $?)"
  grep -E "ERROR SUMMARY|Invalid|checks," "$OUT/memcheck.log" | head -20
fi
exit $rc
