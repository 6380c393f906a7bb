#!/usr/bin/env bash
# Packs what a GPU host without network needs into .gpucarry/ (ignored),
# compressed so that the repository plus this stays under 64 MiB:
#   bins.tar.xz      the relocatable release tree (scripts/bundle.sh, sm_90 only) -> .bundle90/, and
#                    mla-gpu-check + mla-e2e (the op harness and the CUDA logits tool, built here for
#                    sm_90, stripped; they need only the driver), test_allreduce_oneshot and
#                    mla-boundary (bench/boundary_cuda.cu) -> build-gpu-carried/ (share/, which
#                    holds the repo's own model and deploy files, stays here); one archive,
#                    since the three programs share their kernels' code (10.5 -> 6.3 MB)
#   fixtures.tar.xz  the fixture files the GPU checks read that the repo does not hold (the tiny
#                    deepseek3 bf16 model is models/tiny-deepseek3-bf16.gguf) -> .gpu-fixtures/
#   llama-cuda.tar.xz  when .llama-cuda/ exists (scripts/build_llama_cuda.sh)
#   llama-src.tar.xz   with LLAMA_SRC=1 instead: llama.cpp's source (build_llama_cuda.sh --source-tar), which
#                    scripts/gpu_serve_bench.sh builds on the GPU host (FlashAttention kernels in)
#   wheels.tar       with NO_FIXTURES=1 (room for it): the openai client's wheels for the GPU host's
#                    Python (PY_VERSION, default 3.12), which scripts/gpu_serve_bench.sh installs
#                    where the module is missing; WHEELS=0 leaves them out
# On the GPU host scripts/gpu_verify.sh unpacks them. Usage: scripts/gpu_carry.sh
#   env: FIXTURES (default tests/fixtures), HARNESS_BUILD (default build-b90: a CUDA build
#   configured with -DMLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90; build-bundle90: the bundle's own), GLM_Q8=1 adds the glm5 q8_0 file,
#   DS_QUANT=0 leaves out the deepseek3 q8_0 / q4_k_m files, NO_FIXTURES=1 every fixture, NO_LLAMA=1
#   llama.cpp, LLAMA_TAR=FILE carries that llama.cpp package.
set -euo pipefail
cd "$(dirname "$0")/.."
FIX="${FIXTURES:-tests/fixtures}"
HB="${HARNESS_BUILD:-build-b90}"
C=.gpucarry
rm -rf "$C" && mkdir -p "$C"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# HARNESS_BUILD=build-bundle90: the harness is built beside the bundle (tests on), one CUDA build for both
bargs="-DMLA_DEV_SWITCHES=ON"
[ "$HB" = build-bundle90 ] && bargs="$bargs -DBUILD_TESTING=ON"
BUNDLE_CMAKE_ARGS="$bargs" ARCH=90 BUILD=build-bundle90 scripts/bundle.sh .bundle90 >"$tmp/bundle.log" 2>&1 || { tail -20 "$tmp/bundle.log"; exit 1; }
tail -3 "$tmp/bundle.log"
cmake --build "$HB" -j2 --target mla-gpu-check mla-e2e test_allreduce_oneshot mla-boundary >/dev/null
mkdir -p "$tmp/h/build-gpu-carried"
cp "$HB/tests/mla-gpu-check" "$HB/tests/mla-e2e" "$HB/tests/test_allreduce_oneshot" "$HB/tests/mla-boundary" "$tmp/h/build-gpu-carried/"
strip "$tmp/h/build-gpu-carried/"*
tar cf - --exclude=.bundle90/share .bundle90 -C "$tmp/h" build-gpu-carried | xz -T2 -9e >"$C/bins.tar.xz" # -9e: a window over all three
if [ "${NO_FIXTURES:-0}" != 1 ]; then # NO_FIXTURES=1: a benchmark-only call (room for llama.cpp)
mkdir -p "$tmp/f/.gpu-fixtures/tiny-deepseek3" "$tmp/f/.gpu-fixtures/tiny-glm5"
cp "$FIX"/tiny-deepseek3/{ref.json,ref_logits.f32} "$tmp/f/.gpu-fixtures/tiny-deepseek3/"
# the quantized files and llama.cpp's logits for them: the integer GEMV path runs on these
[ "${DS_QUANT:-1}" = 1 ] && cp "$FIX"/tiny-deepseek3/{tiny-deepseek3-q8_0.gguf,tiny-deepseek3-q4_k_m.gguf,llamacpp_logits-q8_0.f32,llamacpp_logits-q4_k_m.f32} "$tmp/f/.gpu-fixtures/tiny-deepseek3/"
cp "$FIX"/tiny-glm5/{ref.json,ref_logits.f32,tiny-glm5-bf16.gguf} "$tmp/f/.gpu-fixtures/tiny-glm5/"
[ "${GLM_Q8:-0}" = 1 ] && cp "$FIX"/tiny-glm5/tiny-glm5-q8_0.gguf "$tmp/f/.gpu-fixtures/tiny-glm5/"
tar cf - -C "$tmp/f" .gpu-fixtures | xz -T2 -6 >"$C/fixtures.tar.xz"
fi
# llama.cpp (scripts/build_llama_cuda.sh): its packed .llama-cuda.tar.xz, else the folder packed here
LT="${LLAMA_TAR:-.llama-cuda.tar.xz}"
if [ "${NO_LLAMA:-0}" = 1 ]; then :
elif [ "${LLAMA_SRC:-0}" = 1 ]; then env -u LLAMA_SRC scripts/build_llama_cuda.sh --source-tar "$C/llama-src.tar.xz" >/dev/null
elif [ -s "$LT" ]; then cp "$LT" "$C/llama-cuda.tar.xz"
elif [ -d .llama-cuda ]; then tar cf - .llama-cuda | xz -T2 -9 >"$C/llama-cuda.tar.xz"; fi
if [ "${NO_FIXTURES:-0}" = 1 ] && [ "${WHEELS:-1}" = 1 ]; then
  python3 -m pip download -q openai --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp/w/wheels" &&
    tar cf "$C/wheels.tar" -C "$tmp/w" wheels
fi
ls -la "$C"
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carried=$(du -cb "$C"/* | tail -1 | cut -f1)
echo "tracked $((tracked / 1048576)) MiB + carried $((carried / 1048576)) MiB = $(((tracked + carried) / 1048576)) MiB (limit 64)"
