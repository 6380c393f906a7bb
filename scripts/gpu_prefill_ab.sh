#!/usr/bin/env bash
# The non-absorbed prompt attention (kernels/attn_prefill_cuda.h) against the absorbed path it
# replaces, on a GPU host, for each model family of FAMS (mkmodel's: v2lite glm47flash v3):
#   1. mla-gpu-check --prefill --quick, as built and as sm_120 (MLA_CUDA_SMEM_CAP=sm120): every
#      shape against the CPU reference;
#   2. the logits of a LAYERS-layer file (real widths) over a PROMPT-token prompt, whole and in
#      chunks of CHUNK, from mla-e2e --fast with the non-absorbed path (the default from
#      MLA_CUDA_PREFILL_MIN = 256 tokens) and with the absorbed one (MLA_CUDA_PREFILL_MIN=1048576):
#      max |difference|, relative L2, argmax agreement (tests/model/compare_logits.py);
#   3. the whole model's prompt steps (mlaserve bench --prefill LIST --batch none), both paths.
# Needs build-gpu-carried/ (mla-gpu-check, mla-e2e) and the bundle (.bundle90, for mkmodel and
# bench), as scripts/gpu_carry.sh packs them. Outputs in OUT (default ./out), one archive.
# Env: FAMS (default glm47flash), LAYERS (3), PROMPT (600), CHUNK (300), LIST (1024,2048,4096,8192).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
R=$(mktemp -d) W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
[ -x build-gpu-carried/mla-e2e ] || { [ -f .gpucarry/bins.tar.xz ] && tar xJf .gpucarry/bins.tar.xz; }
H=build-gpu-carried MLA=${BUNDLE:-.bundle90}/bin/mlaserve OLD=MLA_CUDA_PREFILL_MIN=1048576
N=${PROMPT:-600} C=${CHUNK:-300}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/gpu.txt"
timeout 120 "$H/mla-gpu-check" --prefill --quick >"$R/checks.log" 2>&1; echo "checks: exit $?"
MLA_CUDA_SMEM_CAP=sm120 timeout 120 "$H/mla-gpu-check" --prefill --quick >"$R/checks-sm120.log" 2>&1
echo "checks as sm_120: exit $?"
python3 -c "import random; random.seed(7); print(' '.join(str(random.randrange(100, 100000)) for _ in range($N)))" >"$W/tok.txt"
for fam in ${FAMS:-glm47flash}; do
  M="$W/$fam.gguf"
  timeout 120 "$MLA" mkmodel --family "$fam" --layers "${LAYERS:-3}" --split-size 0 -o "$M" >"$R/mk-$fam.log" 2>&1 ||
    { echo "$fam: mkmodel failed"; continue; }
  for form in new old; do
    for ch in 0 "$C"; do
      e=(); [ "$form" = old ] && e=("$OLD")
      c=(); [ "$ch" != 0 ] && c=(--chunk "$ch")
      env "${e[@]}" timeout 120 "$H/mla-e2e" logits -m "$M" --fast --tokens "$W/tok.txt" --out "$W/$fam-$form-$ch.f32" \
        "${c[@]}" >"$R/e2e-$fam-$form-$ch.log" 2>&1 || echo "$fam: mla-e2e $form chunk $ch: exit $?"
    done
  done
  for p in "new-0 old-0" "new-$C old-$C" "new-$C new-0"; do
    set -- $p
    python3 tests/model/compare_logits.py "$W/$fam-$1.f32" "$W/$fam-$2.f32" --rows "$N" --label "$fam $1 vs $2" |
      tee -a "$R/compare.txt"
  done
  rm -f "$W/$fam"-*.f32 "$M"
  M="$W/$fam-whole.gguf"
  timeout 300 "$MLA" mkmodel --family "$fam" --split-size 0 -o "$M" >"$R/mk-$fam-whole.log" 2>&1 ||
    { echo "$fam: mkmodel (whole) failed"; continue; }
  for form in new old; do
    e=(); [ "$form" = old ] && e=(--env "$OLD")
    timeout 300 "$MLA" bench -m "$M" --prefill "${LIST:-1024,2048,4096,8192}" --batch none --repeat 2 "${e[@]}" \
      --json "$R/bench-$fam-$form.json" >"$R/bench-$fam-$form.log" 2>&1 || echo "$fam: bench $form: exit $?"
    echo "$fam $form:"; grep " prefill " "$R/bench-$fam-$form.log"
  done
  rm -f "$M"
done
tar czf "$OUT/prefill-ab.tgz" -C "$R" . && rm -rf "$R" && echo "outputs: $OUT/prefill-ab.tgz"
