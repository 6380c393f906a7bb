#!/usr/bin/env bash
# The sm_120 configuration checked on an H100/H200 (MLA_CUDA_SMEM_CAP=sm120: every kernel's shared
# memory capped at 99 KB a block, no wgmma; docs/sm120.md), each phase bounded, the whole run
# within TOTAL_S (default 300 s; a phase that would not fit in what is left is skipped and says so):
#   1. the op checks under the cap (mla-gpu-check --quick; OPS_S, default 120 s): the 16-key tile
#      attention is what runs for 512 + 64, and every other kernel within 99 KB
#   2. the fixtures through the CUDA forward pass under the cap (scripts/gpu_check.sh --e2e;
#      E2E_S, default 100 s)
#   3. the benchmark rows twice, normal and capped (scripts/gpu_bench.sh with CAP=sm120, shortened:
#      one run a row, 8 timed steps), and their row-by-row comparison (bench/ab_rows.py), for each
#      of FAMILIES (default "v3 glm5 v2lite": the 24 rows) while time is left
# Input: .gpucarry/ made by scripts/gpu_carry.sh on the build host (unpacked here unless
# build-gpu-carried/ is already there). Output: $OUT (default ./out): sm120-summary.md first.
# The synthetic models of phase 3 are written first (mkmodel, ~9 GB each for V3 and GLM-5) unless
# an earlier scripts/gpu_bench.sh left them in BENCH_DIR: within 300 s the op checks, the fixtures
# and V3's rows as far as time allows; TOTAL_S=570 leaves time for all 24 rows (3 families).
# Everything under $OUT is also in $OUT/0-sm120-out.tgz.
# Usage: scripts/gpu_sm120.sh   env: CAP (default sm120), TOTAL_S, OPS_S, E2E_S, FAMILIES
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CAP="${CAP:-sm120}"
TOTAL_S="${TOTAL_S:-300}"
t0=$(date +%s)
left() { echo $((TOTAL_S - ($(date +%s) - t0))); }
S="$OUT/sm120-summary.md"
echo "# MLA_CUDA_SMEM_CAP=$CAP on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" >"$S"
if [ ! -x build-gpu-carried/mla-gpu-check ]; then
  for f in .gpucarry/*.tar.xz; do tar xJf "$f" || echo "unpack $f failed"; done
fi
rc=0
# 1. op checks
ops_s=$(( $(left) < ${OPS_S:-120} ? $(left) : ${OPS_S:-120} ))
MLA_CUDA_SMEM_CAP="$CAP" timeout "$ops_s" build-gpu-carried/mla-gpu-check --quick --out "$OUT/sm120-ops-table.md" \
  >"$OUT/sm120-gpu-check.log" 2>&1
orc=$?
[ $orc = 0 ] || rc=1
{ echo; echo "## op checks (mla-gpu-check --quick, exit status $orc, bound $ops_s s)"
  grep -E "^configuration:|tensor cores" "$OUT/sm120-gpu-check.log"
  grep -E "FAIL|differ|error|mismatch" "$OUT/sm120-gpu-check.log" | head -20
  grep -E "^\| mla_attn .*tc16" "$OUT/sm120-ops-table.md" 2>/dev/null | cut -c1-160
  tail -2 "$OUT/sm120-ops-table.md" 2>/dev/null; } | tee -a "$S"
# 2. fixtures
e2e_s=$(( $(left) < ${E2E_S:-100} ? $(left) : ${E2E_S:-100} ))
if [ "$e2e_s" -ge 20 ]; then
  MLA_CUDA_SMEM_CAP="$CAP" PREBUILT=1 BUILD=build-gpu-carried FIX=.gpu-fixtures OUT="$OUT/e2e" \
    timeout "$e2e_s" scripts/gpu_check.sh --no-ops --e2e >"$OUT/sm120-e2e.log" 2>&1
  erc=$?
  [ $erc = 0 ] || rc=1
  { echo; echo "## fixtures (scripts/gpu_check.sh --e2e, exit status $erc, bound $e2e_s s)"
    cat "$OUT/e2e/e2e-table.md" 2>/dev/null || tail -15 "$OUT/sm120-e2e.log"; } | tee -a "$S"
else
  echo "## fixtures: skipped ($(left) s left)" | tee -a "$S"
fi
# 3. benchmark rows, normal then capped
for F in ${FAMILIES:-v3 glm5 v2lite}; do
  l=$(left)
  if [ "$l" -lt 40 ]; then echo "## bench $F: skipped ($l s left)" | tee -a "$S"; continue; fi
  FAMILY="$F" CAP="$CAP" BUNDLE="${BUNDLE:-.bundle90}" LLAMA=0 NCU=0 E2E_ALONE=0 REPEAT=1 WARMUP=1 \
    OURS_S=$(( (l - 10) / 2 )) BW_GBS="${BW_GBS:-4250}" \
    BENCH_ARGS="${BENCH_ARGS:---prefill 512,4096 --batch 1,8,32,128,256 --ctx 1024,16384 --steps 8}" \
    timeout "$l" scripts/gpu_bench.sh >"$OUT/sm120-bench-$F.log" 2>&1 || rc=1
  { echo; echo "## bench $F"; cat "$OUT/cap-$CAP-$F.md" 2>/dev/null || tail -8 "$OUT/sm120-bench-$F.log"; } | tee -a "$S"
done
echo; echo "total $(( $(date +%s) - t0 )) s, exit status $rc" | tee -a "$S"
rm -f "$OUT"/0-bench-*.tgz
tar czf /tmp/sm120-out.tgz -C "$OUT" . 2>/dev/null && mv /tmp/sm120-out.tgz "$OUT/0-sm120-out.tgz"
exit $rc
