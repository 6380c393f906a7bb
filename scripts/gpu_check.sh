#!/usr/bin/env bash
# The one script to run on a GPU host: configures a CUDA-only build (MLA_GPU_ONLY: common +
# kernels + the op harness; that machine has no libzmq/libuv/protobuf-c/pcre2), builds it, runs
# (C warnings that a different gcc raises in others' files do not stop it), the host check of the dequantizers and mla-gpu-check, and writes the table to $OUT (or ./out).
#   scripts/gpu_check.sh [--quick] [--sanitize] [--e2e] [--no-ops] [--stack] [--mma3] [--prefill]
#       env: ARCH (default 90), BUILD (default build-gpu), FIX (fixtures, default .gpu-fixtures),
#            BUNDLE (--stack: the release tree of `make bundle`, default .bundle),
#            PREBUILT=1: BUILD already holds mla-gpu-check and mla-e2e (built elsewhere and carried):
#            nothing is compiled here
# By default the caches are paged and decode steps take the batched path with CUDA graphs
# (worker/model_cuda.h mla_cmodel_decode); rows marked "eager" run with MLA_CUDA_GRAPHS=0,
# "unbatched" with MLA_CUDA_BATCHED=0; "--batch" decodes all prompts together.
# --e2e: after the op checks, the fixtures through the CUDA forward pass (mla-e2e, driven by
# tests/model/check_logits.py with the CPU tests' bounds) at TP = 1, 2, 4 (ranks as threads
# sharing the GPU through the host collective), and a short table. Fixtures travel in .gpu-fixtures/
# (ignored; scripts/gpu_carry.sh packs them into .gpucarry/fixtures.tar.xz, carried with the
# repository).
# --stack: the whole distributed stack from the bundle (scripts/bundle.sh, built on a build host
# and carried): `mlaserve logits --tp 1/2/4 --backend cuda` (coordinator + mlaserve-worker
# processes; TP 1 on NCCL, TP > 1 sharing the one GPU through the host collective) checked by
# check_logits.py on both bf16 fixtures, and `mlaserve serve --backend cuda --tp 2` answering a
# chat. Needs no build there (with --no-ops and without --e2e nothing is compiled).
# --mma3: only the prefill matmul paths side by side (mla-gpu-check --mma3: fp32 GEMV, bf16 mma,
# split-bf16 mma3; errors against the CPU in double, times), table in $OUT/gpu-mma3-table.md.
# --prefill: the prompt attention in the non-absorbed form: its op checks and timings beside the
# absorbed path (mla-gpu-check --prefill, table in $OUT/gpu-prefill-table.md), then (without
# --e2e, which runs them anyway) the fixture rows that take it (e2e table in $OUT/e2e-table.md).
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
stack=0
mma3=0
prefill=0
for a in "$@"; do
  case "$a" in
    --quick) quick="--quick" ;;
    --sanitize) sanitize=1 ;;
    --e2e) e2e=1 ;;
    --no-ops) ops=0 ;;
    --stack) stack=1 ;;
    --mma3) mma3=1 ;;
    --prefill) prefill=1 ;;
    *) echo "usage: $0 [--quick] [--sanitize] [--e2e] [--no-ops] [--stack] [--mma3] [--prefill]" >&2; exit 2 ;;
  esac
done
export PATH="/usr/local/cuda/bin:$PATH"
# the tiny DeepSeek-V3 bf16 model is in models/ (the fixture archive leaves it out): linked into the
# fixture folder where that has the rest of its files
link_ds_model() {
  if [ -d "$ds" ] && [ ! -e "$ds/tiny-deepseek3-bf16.gguf" ] && [ -f models/tiny-deepseek3-bf16.gguf ]; then
    ln -sf "$PWD/models/tiny-deepseek3-bf16.gguf" "$ds/tiny-deepseek3-bf16.gguf"
  fi
}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu-info.txt" || true
start=$(date +%s)
if [ "${PREBUILT:-0}" = 1 ]; then
  [ -x "$BUILD/mla-gpu-check" ] && [ -x "$BUILD/mla-e2e" ] || { echo "PREBUILT=1 but $BUILD lacks mla-gpu-check/mla-e2e" >&2; exit 1; }
  echo "prebuilt: $BUILD"
elif [ "$ops" = 1 ] || [ "$e2e" = 1 ] || [ "$sanitize" = 1 ] || [ "$mma3" = 1 ] || [ "$prefill" = 1 ]; then
cmake -S . -B "$BUILD" "${gen[@]}" -DMLA_GPU_ONLY=ON -DMLA_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS="-Wno-maybe-uninitialized" \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
"$BUILD/test_cuda_quant_host" | tail -1
fi
rc=0
if [ "$ops" = 1 ]; then
  timeout "${OPS_S:-330}" "$BUILD/mla-gpu-check" $quick --out "$OUT/gpu-ops-table.md" >"$OUT/gpu-check.log" 2>&1 || rc=$?
  grep -E "FAIL|differ|error|mismatch" "$OUT/gpu-check.log" | head -40 || true
  if [ "$e2e" = 1 ]; then grep -E "^(mla_attn|dsa|head_matmul|moe_experts|sample|cuda_selfcheck)" "$OUT/gpu-check.log" | cut -c1-130; tail -2 "$OUT/gpu-ops-table.md" 2>/dev/null || true
  else cat "$OUT/gpu-ops-table.md" 2>/dev/null || tail -40 "$OUT/gpu-check.log"; fi
  echo "mla-gpu-check exit status $rc ($(( $(date +%s) - start )) s since start)"
fi
if [ "$mma3" = 1 ]; then
  timeout "${MMA3_S:-240}" "$BUILD/mla-gpu-check" --mma3 --out "$OUT/gpu-mma3-table.md" >"$OUT/gpu-mma3.log" 2>&1 || rc=$?
  grep -E "^(gemv|mma|ceiling|device)" "$OUT/gpu-mma3.log" | cut -c1-140
  echo "mla-gpu-check --mma3 exit status $rc"
fi
if [ "$e2e" = 1 ] || [ "$prefill" = 1 ]; then
  FIX="${FIX:-.gpu-fixtures}"
  ds="$FIX/tiny-deepseek3" glm="$FIX/tiny-glm5"
  link_ds_model
  chk=(python3 tests/model/check_logits.py --mlaserve "$BUILD/mla-e2e")
  : >"$OUT/e2e.log"
  table="$OUT/e2e-table.md"
  printf "| run | result | numbers |\n|---|---|---|\n" >"$table"
  e2e_run() { # name, env, args...
    local name="$1" envs="$2"; shift 2
    local t0=$(date +%s) r=0 prev="" x
    for x in "$@"; do # a fixture left behind (the transfer limit): the row says so
      if [ "$prev" = --model ] && [ ! -e "$x" ]; then printf "| %s | skipped | %s not carried |\n" "$name" "$x" >>"$table"; return 0; fi
      prev="$x"
    done
    echo "== $name ($envs)" >>"$OUT/e2e.log"
    env $envs timeout 120 "${chk[@]}" "$@" >"$OUT/e2e-one.log" 2>&1 || r=$?
    cat "$OUT/e2e-one.log" >>"$OUT/e2e.log"
    local tot; tot=$(grep -E "^TOTAL|ranks vs 1 rank|rank 0: CUDA graphs|FAIL|failed|Error|error" "$OUT/e2e-one.log" | tr '\n' ' ' | cut -c1-400)
    local res=pass; [ $r = 0 ] || { res="FAIL($r)"; case "$name" in *--fast*) res="$res, informational";; *) rc=1;; esac; }
    printf "| %s | %s | %s (%ss) |\n" "$name" "$res" "$tot" "$(( $(date +%s) - t0 ))" >>"$table"
  }
  prefill_rows() {
    # prompt steps in the non-absorbed form (kernels/attn_prefill_cuda.h), the threshold lowered
    # (MLA_CUDA_PREFILL_MIN, a developer switch) so that the fixtures' prompts take it: against HF
    # at the tensor-core attention's bounds; one pass == incremental (the later tokens on the
    # absorbed decode path) and == chunks (prefixes from the cache; with --fast chunks of up to 8
    # tokens keep the absorbed path: prompts mix both); glm5 within its top-k (no selection); TP 2;
    # --stagger: a served plan's order (worker/engine_cuda.c), each step a prompt chunk through
    # the non-absorbed form, then the batched decode (graphs) of the prompts before it
    e2e_run "ds3 bf16 TP1 non-absorbed prompt attention (MLA_CUDA_PREFILL_MIN=2) vs HF + greedy, incr, chunks of 5" "MLA_CUDA_ATTN=tc MLA_CUDA_PREFILL_MIN=2" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --incremental 4 --inc-rtol 1e-2 --chunk 5 --chunk-rtol 1e-2
    # chunks of 77 tokens (the 154-token prompt in two; the others whole): each chunk takes the same
    # kernels as the one pass, so the two agree to the bit (measured 0). Smaller chunks change the
    # arithmetic, not the result's quality: 9-16 tokens take int8 activations (the decode path's),
    # the routed experts the integer GEMV below MLA_MOE_MMH_MIN pairs an expert on average, the
    # router's float product the GEMV up to 64 tokens (chunks of 12: 4.9e-2 of the largest logit,
    # 22: 1.4e-1; both within the bounds against HF and llama.cpp)
    e2e_run "ds3 q8_0 TP1 --fast non-absorbed prompt attention (fp16 k_b / v_b) vs HF + llama.cpp, chunks of 77" "MLA_E2E_FAST=1 MLA_CUDA_PREFILL_MIN=2" --fixture "$ds" --model "$ds/tiny-deepseek3-q8_0.gguf" --hf-argmax 0.98 --hf-dlogp 0.15 --llamacpp "$ds/llamacpp_logits-q8_0.f32" --lc-dlogp 0.2 --chunk 77 --chunk-rtol 1e-2
    e2e_run "ds3 bf16 TP2 non-absorbed prompt attention == TP1 vs HF + greedy" "MLA_CUDA_ATTN=tc MLA_CUDA_PREFILL_MIN=2" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 2 --tp-rtol 1e-2 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy
    e2e_run "ds3 bf16 TP1 --stagger: prompt chunks of 5, non-absorbed (MLA_CUDA_PREFILL_MIN=2), beside graphed decodes vs HF + greedy" "MLA_CUDA_ATTN=tc MLA_CUDA_PREFILL_MIN=2 MLA_CUDA_GRAPHS=require" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --extra=--stagger --extra=--chunk --extra=5
    e2e_run "glm5 bf16 TP1 --stagger: prompt chunks of 3, non-absorbed, beside batched decodes (DSA) vs HF + greedy" "MLA_CUDA_ATTN=tc MLA_CUDA_PREFILL_MIN=2" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 0,1,2,3,4,5,6,8,9,10,11 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --extra=--stagger --extra=--chunk --extra=3
    e2e_run "glm5 bf16 TP1 non-absorbed prompt attention (prompts within top-k) vs HF + greedy, chunks of 3" "MLA_CUDA_ATTN=tc MLA_CUDA_PREFILL_MIN=2" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 0,1,2,3,4,5,6,8,9,10,11 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --chunk 3 --chunk-rtol 1e-2
  }
fi
if [ "$prefill" = 1 ]; then
  timeout "${PREFILL_S:-240}" "$BUILD/mla-gpu-check" --prefill --out "$OUT/gpu-prefill-table.md" >"$OUT/gpu-prefill.log" 2>&1 || rc=$?
  grep -E "^(device|configuration|cuda_selfcheck|prefill_attn|prefill attention)" "$OUT/gpu-prefill.log" | cut -c1-260 || true
  grep -E "FAIL|error" "$OUT/gpu-prefill.log" | head -20 || true
  tail -1 "$OUT/gpu-prefill-table.md" 2>/dev/null || tail -20 "$OUT/gpu-prefill.log"
  echo "mla-gpu-check --prefill exit status $rc ($(( $(date +%s) - start )) s since start)"
  if [ "$e2e" != 1 ]; then
    prefill_rows
    cat "$table"
  fi
fi
if [ "$e2e" = 1 ]; then
  e2e_run "ds3 bf16 TP1 vs HF + greedy (decode: graphs)" "MLA_CUDA_GRAPHS=require" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "ds3 bf16 TP1 --batch greedy (all prompts decoded together, graphs)" "MLA_CUDA_GRAPHS=require" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --extra=--batch
  e2e_run "ds3 bf16 TP1 --batch greedy, eager" "MLA_CUDA_GRAPHS=0" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --extra=--batch
  e2e_run "ds3 bf16 TP1 unbatched (MLA_CUDA_BATCHED=0) vs HF + greedy" "MLA_CUDA_BATCHED=0" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "ds3 bf16 TP1 incremental (graphs) == one pass" "MLA_CUDA_GRAPHS=require" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --prompts 0,5,8 --incremental 4 --inc-rtol 1e-4
  e2e_run "ds3 bf16 TP1 --split vs HF + greedy" "MLA_E2E_FAST=split" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "glm5 bf16 TP1 vs HF + greedy" "X=1" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "glm5 bf16 TP1 long (DSA) bf16 RoPE freqs, 0.01 + greedy + incr (graphs)" "MLA_CUDA_GRAPHS=require" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --incremental 40 --inc-rtol 1e-4
  e2e_run "glm5 bf16 TP1 all prompts --batch greedy (DSA on and off in one step), bf16 RoPE freqs" "MLA_CUDA_GRAPHS=require" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --extra=--batch
  e2e_run "glm5 bf16 TP1 long (DSA) exact freqs + greedy" "X=1" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --hf-argmax 0.99 --hf-dlogp 0.05 --greedy
  e2e_run "ds3 q8_0 TP1 vs HF + llama.cpp" "" --fixture "$ds" --model "$ds/tiny-deepseek3-q8_0.gguf" --hf-argmax 0.98 --hf-dlogp 0.15 --llamacpp "$ds/llamacpp_logits-q8_0.f32" --lc-dlogp 0.2
  e2e_run "ds3 q4_k_m TP1 vs HF + llama.cpp" "" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" --hf-argmax 0.95 --hf-dlogp 1.5 --llamacpp "$ds/llamacpp_logits-q4_k_m.f32" --lc-dlogp 0.5
  # the integer GEMV (int8 activations, dp4a) on the quantized files (greedy ids are not HF's
  # there: decode steps are checked as incremental == one pass, in graphs), TP 2 grouped experts.
  # Incremental and TP 2 are held to 1e-2, not 1e-4: a last-bit difference upstream (another
  # summation order) can move an activation across a rounding boundary of its 8-bit grid, a step
  # of ~0.4% of its block's largest value, which the following layers carry (seen: 2.8e-3).
  q8c=(--hf-argmax 0.95 --hf-dlogp 1.5 --llamacpp "$ds/llamacpp_logits-q4_k_m.f32" --lc-dlogp 0.5)
  e2e_run "ds3 q8_0 TP1 integer GEMV (MLA_CUDA_Q8=1) vs HF + llama.cpp, incr (graphs)" "MLA_CUDA_Q8=1 MLA_CUDA_GRAPHS=require" --fixture "$ds" --model "$ds/tiny-deepseek3-q8_0.gguf" --hf-argmax 0.98 --hf-dlogp 0.15 --llamacpp "$ds/llamacpp_logits-q8_0.f32" --lc-dlogp 0.2 --incremental 4 --inc-rtol 1e-2
  e2e_run "ds3 q4_k_m TP1 integer GEMV (MLA_CUDA_Q8=1) vs HF + llama.cpp, incr (graphs)" "MLA_CUDA_Q8=1 MLA_CUDA_GRAPHS=require" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" "${q8c[@]}" --incremental 4 --inc-rtol 1e-2
  e2e_run "ds3 q4_k_m TP1 split prefill + integer GEMV (MLA_E2E_FAST=split) vs HF + llama.cpp" "MLA_E2E_FAST=split" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" "${q8c[@]}"
  e2e_run "ds3 q4_k_m TP2 integer GEMV == TP1 vs HF + llama.cpp" "MLA_CUDA_Q8=1" --fixture "$ds" --model "$ds/tiny-deepseek3-q4_k_m.gguf" --tp 2 --tp-rtol 1e-2 "${q8c[@]}"
  e2e_run "ds3 bf16 TP2 vs HF + greedy (host collective: batched, eager)" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 2 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  e2e_run "ds3 bf16 TP2 --batch greedy" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 2 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --extra=--batch
  e2e_run "glm5 bf16 TP4 == TP1 + incr" "X=1" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --tp 4 --tp-rtol 1e-4 --incremental 30 --inc-rtol 1e-4
  e2e_run "glm5 bf16 TP4 --batch greedy, bf16 RoPE freqs" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --tp 4 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --extra=--batch
  # attention on fp16 tensor cores (the default outside exact mode) with every matmul exact: its
  # own error against HF (bound 0.02; measured up to 0.011 on the long glm5 prompt), incremental
  # and TP 2 at 1e-2
  e2e_run "ds3 bf16 TP1 tensor-core attention (MLA_CUDA_ATTN=tc) vs HF + greedy, incr (graphs)" "MLA_CUDA_ATTN=tc MLA_CUDA_GRAPHS=require" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --incremental 4 --inc-rtol 1e-2
  e2e_run "ds3 bf16 TP1 tensor-core attention --batch greedy" "MLA_CUDA_ATTN=tc" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --extra=--batch
  e2e_run "glm5 bf16 TP1 long (DSA) tensor-core attention, bf16 RoPE freqs + greedy + incr (graphs)" "MLA_CUDA_ATTN=tc MLA_CUDA_GRAPHS=require" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --incremental 40 --inc-rtol 1e-2
  e2e_run "glm5 bf16 TP1 all prompts tensor-core attention --batch greedy, bf16 RoPE freqs" "MLA_CUDA_ATTN=tc" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --extra=--batch
  e2e_run "glm5 bf16 TP2 tensor-core attention == TP1 vs HF" "MLA_CUDA_ATTN=tc" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 0,3,7 --tp 2 --tp-rtol 1e-2 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.02
  prefill_rows
  # step timings of the tiny model (launch-bound: 4 layers of 256 wide)
  python3 -c "import json;[print(' '.join(map(str,p['tokens']))) for p in json.load(open('$ds/ref.json'))['prompts'][:3]]" >"$OUT/tok.txt"
  for v in "MLA_CUDA_BATCHED=0" "MLA_CUDA_GRAPHS=0" "X=1"; do
    echo "$v: $(env $v MLA_E2E_TIME=1 "$BUILD/mla-e2e" logits -m "$ds/tiny-deepseek3-bf16.gguf" --tokens "$OUT/tok.txt" --out "$OUT/l.f32" --greedy 24 --ids-out "$OUT/ids.txt" 2>&1 | grep timing)" || true
  done
  echo "--batch: $(MLA_E2E_TIME=1 "$BUILD/mla-e2e" logits -m "$ds/tiny-deepseek3-bf16.gguf" --tokens "$OUT/tok.txt" --out "$OUT/l.f32" --greedy 24 --ids-out "$OUT/ids.txt" --batch 2>&1 | grep -E 'timing|graphs' | tr '\n' ' ')" || true
  rm -f "$OUT/l.f32"
  cat "$table"
  echo "e2e done ($(( $(date +%s) - start )) s since start)"
fi
if [ "$stack" = 1 ]; then
  FIX="${FIX:-.gpu-fixtures}"
  ds="$FIX/tiny-deepseek3" glm="$FIX/tiny-glm5"
  link_ds_model
  B="$(cd "${BUNDLE:-.bundle}" && pwd)"
  W=/tmp/mla-stack
  rm -rf "$W" && mkdir -p "$W"
  unset LD_LIBRARY_PATH
  echo "bundle: $(ls "$B/bin" | tr '\n' ' '); libs not found: $(ldd "$B"/bin/* | grep -c 'not found' || true)"
  ldd "$B/bin/mlaserve-worker" | grep -E "nccl|not found" || true
  # check_logits.py runs `BIN logits ...`: BIN appends --backend cuda (a backend => worker processes)
  printf '#!/bin/sh\nexec "%s/bin/mlaserve" "$@" --backend cuda\n' "$B" >"$W/mlaserve-cuda"
  chmod +x "$W/mlaserve-cuda"
  chk=(python3 tests/model/check_logits.py --mlaserve "$W/mlaserve-cuda")
  table="$OUT/stack-table.md"
  printf "| run (mlaserve logits --backend cuda, worker processes) | result | numbers |\n|---|---|---|\n" >"$table"
  : >"$OUT/stack.log"
  st_run() { # name, env, args...
    local name="$1" envs="$2"; shift 2
    local t0=$(date +%s) r=0
    echo "== $name ($envs)" >>"$OUT/stack.log"
    env $envs timeout 180 "${chk[@]}" "$@" >"$W/one.log" 2>&1 || r=$?
    cat "$W/one.log" >>"$OUT/stack.log"
    local tot; tot=$(grep -E "^TOTAL|ranks vs 1 rank|rank 0: CUDA graphs|FAIL|failed|Error|error" "$W/one.log" | tr '\n' ' ' | cut -c1-400)
    local res=pass; [ $r = 0 ] || { res="FAIL($r)"; rc=1; }
    printf "| %s | %s | %s (%ss) |\n" "$name" "$res" "$tot" "$(( $(date +%s) - t0 ))" >>"$table"
  }
  # which collective each TP uses (the worker logs it): TP 1 = NCCL (one rank per GPU)
  python3 -c "import json;[print(' '.join(map(str,p['tokens']))) for p in json.load(open('$ds/ref.json'))['prompts'][:2]]" >"$W/tok.txt"
  for tp in 1 2; do
    timeout 120 "$B/bin/mlaserve" logits -m "$ds/tiny-deepseek3-bf16.gguf" --tokens "$W/tok.txt" --out "$W/l.f32" \
      --tp $tp --backend cuda >"$W/coll$tp.log" 2>&1 || echo "TP $tp direct run failed: $(tail -3 "$W/coll$tp.log")"
    echo "TP $tp: $(grep -hE 'collective:|NCCL|self-check failed' "$W/coll$tp.log" | sed -E 's/^.*(collective:|NCCL|self-check)/\1/' | sort | uniq -c | tr '\n' ';')"
  done | tee -a "$OUT/stack.log"
  st_run "ds3 bf16 TP1 (NCCL) vs HF + greedy" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  st_run "ds3 bf16 TP1 host coll (--nccl off) vs HF" "" --extra=--nccl=off --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --prompts 0,5,8 --hf-argmax 0.99 --hf-dlogp 0.01
  st_run "glm5 bf16 TP1 (NCCL) vs HF + greedy" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  # the engine's default attention rounds queries, keys and softmax weights to fp16 over an fp16
  # latent cache and fp16 indexer keys (as llama.cpp's CUDA kernels over theirs; the reference
  # indexer keeps fp8 keys): on the long glm5 prompt the worst |dlogp| moves from ~1e-5 to 0.011
  # (measured), 0.02 there. Its DSA selections are near ties (from the CPU reference: of the 220
  # (position, layer) selections past position 100, 20 separate the 32nd and 33rd key by less than
  # 0.2% of the score, 5 are exact ties at 0) and one router choice is (position 138, layer 2:
  # 1.2%): each way of running the prompt (one pass, token by token, chunks) rounds differently and
  # may pick the other key or expert; positions 138-139 then differ by up to 4 logits (measured
  # 2026-12-03) though every way stays within the HF bounds. So those ways are each checked against
  # HF (--paths-vs-hf) with the fp16 cache; fp32 attention (over an fp32 cache, its default) keeps
  # 0.01 and one pass == the others at 1e-4
  st_run "glm5 bf16 TP1 long, bf16 RoPE freqs, 0.02 + greedy; incr vs HF" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --incremental 40 --paths-vs-hf
  st_run "glm5 bf16 TP1 long, fp32 attention (MLA_CUDA_ATTN=fp32), 0.01 + greedy + incr" "MLA_CUDA_ATTN=fp32" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --incremental 40 --inc-rtol 1e-4
  st_run "ds3 bf16 TP2 vs HF + greedy" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 2 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  st_run "glm5 bf16 TP2 vs HF + greedy" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --tp 2 --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  st_run "ds3 bf16 TP4 vs HF + greedy" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 4 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  # --allreduce oneshot with the ranks sharing this GPU (over the host collective; their kernels
  # take turns, so slow): steps whose rows fit mla_cuda_ar_add_rmsnorm (128 blocks) sum, add and
  # norm in one launch, longer prompts copy, sum, then norm
  st_run "ds3 bf16 TP2 --allreduce oneshot (fused norms) vs HF + greedy; == TP1" "" --extra=--allreduce=oneshot --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 2 --tp-rtol 1e-2 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  st_run "ds3 bf16 TP2 --allreduce oneshot, token by token == one pass" "" --extra=--allreduce=oneshot --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 2 --hf-argmax 0.99 --hf-dlogp 0.01 --incremental 30 --inc-rtol 1e-2
  st_run "ds3 bf16 TP4 --allreduce oneshot vs HF + greedy; == TP1" "" --extra=--allreduce=oneshot --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --tp 4 --tp-rtol 1e-2 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  st_run "glm5 bf16 TP2 --allreduce oneshot vs HF + greedy" "" --extra=--allreduce=oneshot --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --tp 2 --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  st_run "glm5 bf16 TP4 long, bf16 RoPE freqs, 0.02 + greedy; == TP1" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --tp 4 --tp-rtol 1e-2 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy
  st_run "glm5 bf16 TP4 long, fp32 attention, 0.01; == TP1" "MLA_CUDA_ATTN=fp32" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --tp 4 --tp-rtol 1e-4 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy
  st_run "glm5 bf16 TP4 vs HF" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --tp 4 --prompts 0,1,2,3,4,5,6,8,9,10,11 --hf-argmax 0.99 --hf-dlogp 0.01
  # the cache pool: prompts in chunks (multi-token steps at a later position) and prompts whose
  # first whole blocks another sequence computed (shared, read only: the prefix cache) == one pass
  st_run "ds3 bf16 TP1 chunks of 5, prefix of 20 shared == one pass, vs HF + greedy" "" --fixture "$ds" --model "$ds/tiny-deepseek3-bf16.gguf" --prompts 0,5,8 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --chunk 5 --prefix-reuse 20 --chunk-rtol 1e-2 --reuse-rtol 1e-2
  st_run "glm5 bf16 TP2 long (DSA) chunks of 16, prefix of 100 shared, bf16 RoPE freqs; each vs HF" "" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --tp 2 --hf-argmax 0.99 --hf-dlogp 0.02 --greedy --chunk 16 --prefix-reuse 100 --paths-vs-hf
  st_run "glm5 bf16 TP1 long (DSA) fp32 attention, chunks of 16, prefix of 100 shared" "MLA_CUDA_ATTN=fp32" --fixture "$glm" --model "$glm/tiny-glm5-bf16.gguf" --prompts 7 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy --chunk 16 --prefix-reuse 100 --chunk-rtol 1e-4 --reuse-rtol 1e-4
  # serving: the OpenAI chat API on CUDA worker processes (TP 2: host collective, batched decode
  # eager; TP 1: NCCL, batched decode in CUDA graphs), then 12 different completions sent at once
  # must equal the same completions sent one at a time (greedy): batched decode == one sequence
  for tp in 2 1; do
  t0=$(date +%s)
  rm -f "$W/port"
  "$B/bin/mlaserve" serve -m "$ds/tiny-deepseek3-bf16.gguf" --tp $tp --backend cuda --port 0 --port-file "$W/port" >"$W/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 1 300); do [ -s "$W/port" ] && break; kill -0 $spid 2>/dev/null || break; sleep 0.2; done
  answer="(no server)" conc="(no server)"
  if [ -s "$W/port" ]; then
    answer=$(python3 - "$(cat "$W/port")" <<'PY' 2>&1
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions",
    data=json.dumps({"messages": [{"role": "user", "content": "What is 7 plus 5?"}], "max_tokens": 32}).encode(),
    headers={"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"])
PY
)
    conc=$(python3 - "$(cat "$W/port")" <<'PY' 2>&1
import json, sys, threading, urllib.request
port = sys.argv[1]
prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "The quick brown fox",
           "In the beginning", "Water boils at", "My favourite colour is", "def main():",
           "The sun rises in the", "Hello, my name is", "A B C D", "Seven plus five is"]
def complete(p, out, i):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"prompt": p, "max_tokens": 24, "temperature": 0}).encode(),
        headers={"Content-Type": "application/json"})
    out[i] = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]
seq = [None] * len(prompts)
for i, p in enumerate(prompts): complete(p, seq, i)
con = [None] * len(prompts)
th = [threading.Thread(target=complete, args=(p, con, i)) for i, p in enumerate(prompts)]
[t.start() for t in th]; [t.join() for t in th]
same = sum(a == b for a, b in zip(seq, con))
print(f"{same}/{len(prompts)} equal" + ("" if same == len(prompts) else f"; first diff: {[(a, b) for a, b in zip(seq, con) if a != b][0]!r}"))
PY
)
  fi
  kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
  grep -E "collective|backend|cuda|graph|error" "$W/serve.log" | head -8 >>"$OUT/stack.log" || true
  res=pass; [ "$answer" = "7 plus 5 is 12." ] || { res=FAIL; rc=1; tail -20 "$W/serve.log"; }
  printf "| serve --backend cuda --tp %s: chat \"What is 7 plus 5?\" | %s | answer: %s (%ss) |\n" "$tp" "$res" "$answer" "$(( $(date +%s) - t0 ))" >>"$table"
  res=pass; [ "$conc" = "12/12 equal" ] || { res=FAIL; rc=1; }
  printf "| serve --backend cuda --tp %s: 12 completions at once == one at a time (greedy) | %s | %s |\n" "$tp" "$res" "$conc" >>"$table"
  done
  cat "$table"
  echo "stack done ($(( $(date +%s) - start )) s since start)"
fi
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "compute-sanitizer memcheck (quick run, at most ${SANITIZE_S:-300} s):"
  timeout "${SANITIZE_S:-300}" compute-sanitizer --tool memcheck --print-limit 20 "$BUILD/mla-gpu-check" --quick \
    >"$OUT/memcheck.log" 2>&1 || echo "(memcheck run ended with status $?)"
  grep -E "ERROR SUMMARY|Invalid|checks," "$OUT/memcheck.log" | head -20
fi
exit $rc
