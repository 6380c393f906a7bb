#!/usr/bin/env bash
# The one script to run on the GPU machine: configures a CUDA-only build (MLA_GPU_ONLY: common +
# kernels + the op harness; that machine has no libzmq/libuv/protobuf-c/pcre2), builds it, runs
# (C warnings that a different gcc raises in others' files do not stop it), the host check of the dequantizers and mla-gpu-check, and writes the table to $OUT (or ./out).
#   scripts/gpu_check.sh [--quick] [--sanitize]    env: ARCH (default 90), BUILD (default build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
ARCH="${ARCH:-90}"
BUILD="${BUILD:-build-gpu}"
quick=""
sanitize=0
for a in "$@"; do
  case "$a" in
    --quick) quick="--quick" ;;
    --sanitize) sanitize=1 ;;
    *) echo "usage: $0 [--quick] [--sanitize]" >&2; exit 2 ;;
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
"$BUILD/mla-gpu-check" $quick --out "$OUT/gpu-ops-table.md" >"$OUT/gpu-check.log" 2>&1 || rc=$?
grep -E "FAIL|differ|error" "$OUT/gpu-check.log" | head -40 || true
cat "$OUT/gpu-ops-table.md" 2>/dev/null || tail -40 "$OUT/gpu-check.log"
echo "mla-gpu-check exit status $rc"
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "compute-sanitizer memcheck (quick run, at most ${SANITIZE_S:-300} s):"
  timeout "${SANITIZE_S:-300}" compute-sanitizer --tool memcheck --print-limit 20 "$BUILD/mla-gpu-check" --quick \
    >"$OUT/memcheck.log" 2>&1 || echo "(memcheck run ended with status $?)"
  grep -E "ERROR SUMMARY|Invalid|checks," "$OUT/memcheck.log" | head -20
fi
exit $rc
