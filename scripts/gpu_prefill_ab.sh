#!/usr/bin/env bash
# The non-absorbed prompt attention (kernels/attn_prefill_cuda.h) against the absorbed path it
# replaces, on a GPU host, for each model family of FAMS (mkmodel's: v2lite glm47flash v3):
#   1. mla-gpu-check --prefill --quick, as built and as sm_120 (MLA_CUDA_SMEM_CAP=sm120): every
#      shape against the CPU reference; then mla-gpu-check --router --quick: the MoE routers' narrow
#      kernel (kernels/mm_narrow_cuda.cu) and the bf16 tensor cores it replaces, both against the
#      CPU reference, timed side by side;
#   2. the logits of a LAYERS-layer file (real widths) over a PROMPT-token prompt from mla-e2e, with
#      the non-absorbed path (the default from MLA_CUDA_PREFILL_MIN = 256 tokens) and with the
#      absorbed one (MLA_CUDA_PREFILL_MIN=1048576), each with the served products (--fast: bf16
#      tensor cores) and with fp32-class ones (--split), whole and (--fast) in chunks of CHUNK; each
#      against the CPU's exact logits of the same file (`mlaserve logits`, the reference), and the
#      two paths against each other: max |difference|, relative L2, argmax agreement
#      (tests/model/compare_logits.py);
#   3. the whole model's prompt steps (mlaserve bench --prefill LIST --batch none), both paths
#      (LIST=none: no whole model; BENCH_LAYERS=N: a file of N layers instead, for the models too
#      large for one GPU, such as GLM-5).
# Needs build-gpu-carried/ (mla-gpu-check, mla-e2e) and the bundle (.bundle90, for mkmodel, logits
# and bench), as scripts/gpu_carry.sh packs them. Outputs in OUT/prefill-ab (default ./out), written
# as each step ends, so that a run cut short keeps what it measured.
# Env: FAMS (default glm47flash), LAYERS (3), PROMPT (600), CHUNK (300), LIST (1024,2048,4096,8192),
# BENCH_LAYERS (the whole model), CHECKS (all; prefill: step 1 without the router's; none: no step 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
R="$OUT/prefill-ab" W=$(mktemp -d)
mkdir -p "$R"
trap 'rm -rf "$W"' EXIT
[ -x build-gpu-carried/mla-e2e ] || { [ -f .gpucarry/bins.tar.xz ] && tar xJf .gpucarry/bins.tar.xz; }
H=build-gpu-carried MLA=${BUNDLE:-.bundle90}/bin/mlaserve OLD=MLA_CUDA_PREFILL_MIN=1048576
N=${PROMPT:-600} C=${CHUNK:-300}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/gpu.txt"
ck=${CHECKS:-all}
if [ "$ck" != none ]; then
  timeout 120 "$H/mla-gpu-check" --prefill --quick >"$R/checks.log" 2>&1; echo "checks: exit $?"
  MLA_CUDA_SMEM_CAP=sm120 timeout 120 "$H/mla-gpu-check" --prefill --quick >"$R/checks-sm120.log" 2>&1
  echo "checks as sm_120: exit $?"
fi
if [ "$ck" = all ]; then
  timeout 240 "$H/mla-gpu-check" --router --quick >"$R/router.log" 2>&1; echo "router checks: exit $?"
fi
python3 -c "import random; random.seed(7); print(' '.join(str(random.randrange(100, 100000)) for _ in range($N)))" \
  >"$W/tok.txt"
for fam in ${FAMS:-glm47flash}; do
  M="$W/$fam.gguf"
  timeout 120 "$MLA" mkmodel --family "$fam" --layers "${LAYERS:-3}" --split-size 0 -o "$M" >"$R/mk-$fam.log" 2>&1 ||
    { echo "$fam: mkmodel failed"; continue; }
  timeout 300 "$MLA" logits -m "$M" --tokens "$W/tok.txt" --out "$W/$fam-cpu.f32" --threads "$(nproc)" \
    >"$R/cpu-$fam.log" 2>&1 || echo "$fam: CPU logits: exit $?"
  for form in new old; do
    for run in fast-0 "fast-$C" split-0; do
      e=(); [ "$form" = old ] && e=("$OLD")
      c=(); [ "$run" = "fast-$C" ] && c=(--chunk "$C")
      env "${e[@]}" timeout 120 "$H/mla-e2e" logits -m "$M" "--${run%-*}" --tokens "$W/tok.txt" \
        --out "$W/$fam-$form-$run.f32" "${c[@]}" >"$R/e2e-$fam-$form-$run.log" 2>&1 ||
        echo "$fam: mla-e2e $form $run: exit $?"
    done
  done
  for p in "new-fast-0 cpu" "old-fast-0 cpu" "new-split-0 cpu" "old-split-0 cpu" "new-fast-0 old-fast-0" \
    "new-fast-$C old-fast-$C" "new-fast-$C new-fast-0"; do
    set -- $p
    python3 tests/model/compare_logits.py "$W/$fam-$1.f32" "$W/$fam-$2.f32" --rows "$N" --label "$fam $1 vs $2" |
      tee -a "$R/compare.txt"
  done
  rm -f "$W/$fam"-*.f32 "$M"
  [ "${LIST:-}" = none ] && continue
  M="$W/$fam-whole.gguf" depth=()
  [ -n "${BENCH_LAYERS:-}" ] && depth=(--layers "$BENCH_LAYERS")
  timeout 300 "$MLA" mkmodel --family "$fam" "${depth[@]}" --split-size 0 -o "$M" >"$R/mk-$fam-whole.log" 2>&1 ||
    { echo "$fam: mkmodel (whole) failed"; continue; }
  for form in new old; do
    e=(); [ "$form" = old ] && e=(--env "$OLD")
    timeout 300 "$MLA" bench -m "$M" --prefill "${LIST:-1024,2048,4096,8192}" --batch none --repeat 2 "${e[@]}" \
      --json "$R/bench-$fam-$form.json" >"$R/bench-$fam-$form.log" 2>&1 || echo "$fam: bench $form: exit $?"
    echo "$fam $form:"; grep " prefill " "$R/bench-$fam-$form.log"
  done
  rm -f "$M"
done
echo "outputs: $R"
