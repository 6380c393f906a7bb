#!/usr/bin/env bash
# On a GPU host, everything a build host without a GPU cannot check, in order of importance,
# each phase bounded in time so that a slow one cannot eat the others:
#   1. the CUDA op checks against the CPU references (mla-gpu-check --quick) and the fixtures
#      through the CUDA forward pass (mla-e2e, check_logits.py): scripts/gpu_check.sh --e2e
#   2. the distributed stack from the bundle (coordinator + worker processes, NCCL at TP 1,
#      the host collective at TP 2/4, serving, concurrent requests == one at a time)
#   3. benchmarks at real width: scripts/gpu_bench.sh (mlaserve bench, llama.cpp beside it)
# Input: .gpucarry/ made by scripts/gpu_carry.sh on the build host.
# Output: $OUT (default ./out): tables and logs. Usage: scripts/gpu_verify.sh [--no-bench]
# [--no-ops] [--no-stack]. The whole quick op set took 321 s on an H200 (2026-12-05: 1676 checks),
# so phase 1 with it fills most of a 10-minute command: with the op checks, phases 2 and 3 are
# skipped (the output says so); run again with --no-ops for them (phase 1 then runs the fixtures
# only).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
# never NVLink multicast on these machines (KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bench=1 ops="" stack=1
for a in "$@"; do
  case "$a" in
    --no-bench) bench=0 ;;
    --no-stack) stack=0 ;;
    --no-ops) ops=--no-ops ;; # skip the op checks (phase 1 runs the fixtures only)
    *) echo "usage: $0 [--no-bench] [--no-ops] [--no-stack]   env: LLAMA=0, NCU=0 skip those parts of phase 3" >&2; exit 2 ;;
  esac
done
# keep the outputs few: everything also goes into one archive at the end
# (named to sort first: the files that come back are the first 8 by name)
pack() { tar czf /tmp/verify-out.tgz -C "$OUT" . 2>/dev/null && mv /tmp/verify-out.tgz "$OUT/0-verify-out.tgz"; }
trap pack EXIT
if [ -z "$ops" ] && { [ "$stack" = 1 ] || [ "$bench" = 1 ]; }; then
  echo "the op checks fill this command: phases 2 and 3 skipped (run again with --no-ops for them)"
  stack=0 bench=0
fi
t_start=$(date +%s)
since() { echo "$(( $(date +%s) - t_start )) s"; }
for f in .gpucarry/*.tar.xz; do tar xJf "$f" || echo "unpack $f failed"; done
echo "unpacked ($(since)): $(ls .bundle90/bin build-gpu-carried 2>/dev/null | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
rc=0
echo "== phase 1: op checks + fixtures through the CUDA forward pass"
PREBUILT=1 BUILD=build-gpu-carried FIX=.gpu-fixtures OPS_S="${OPS_S:-360}" \
  timeout "${PHASE1_S:-500}" scripts/gpu_check.sh --quick --e2e $ops || rc=1
echo "phase 1 done ($(since))"
if [ "$stack" = 1 ]; then
  echo "== phase 2: the distributed stack (bundle)"
  BUNDLE=.bundle90 FIX=.gpu-fixtures timeout "${PHASE2_S:-180}" scripts/gpu_check.sh --no-ops --stack || rc=1
  echo "phase 2 done ($(since))"
fi
if [ "$bench" = 1 ]; then
  echo "== phase 3: benchmarks"
  BUNDLE=.bundle90 timeout "${PHASE3_S:-240}" scripts/gpu_bench.sh || rc=1
  echo "phase 3 done ($(since))"
fi
exit $rc
