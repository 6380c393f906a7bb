#!/usr/bin/env bash
# build_llama_cuda.sh - build llama.cpp's llama-bench and llama-batched-bench
# with CUDA for sm_90 (H100/H200) on a machine WITHOUT a GPU, and package them
# so they can be carried to a GPU host without network and run side by
# side with `mlaserve bench`.  See scripts/llama_side_by_side.sh for the runner
# and bench/plot_decode.py for the plot.
#
# Source
#   llama.cpp as vendored in the PyPI sdist of llama-cpp-python 0.3.36
#   (vendor/llama.cpp, upstream ggml-org/llama.cpp commit
#   0c1e57098bba43ac29e6e3b677cdceebdd22334f, "webgpu: fix SSM_SCAN binding
#   aliasing (#29750)"; llama.cpp 0.5.0-dev, ggml 0.25.3).  If the source tree
#   is not present it is fetched with
#       pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36
#   and unpacked under $LCPP_ROOT.  No llama.cpp code is ever copied into this
#   repository; only build outputs land in the git-ignored .llama-cuda/.
#
# CMake configuration (Release, Ninja):
#   -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real   sm_90 SASS only (no PTX, no JIT)
#   -DGGML_NATIVE=OFF                                   portable host code (AVX2/FMA/F16C)
#   -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
#                                                       (AMX repack crashed on an earlier run)
#   -DGGML_CUDA_FA=OFF                                  no FlashAttention kernels (see below; FA=1:
#                                                       ON, f16 K/V only, as the GPU-host build)
#   -DGGML_CUDA_COMPRESSION_MODE=none                   raw SASS in the fatbin: xz packs it
#                                                       ~18% smaller than nvcc's "size" mode
#   -DGGML_CUDA_NCCL=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF
#   -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH=$ORIGIN
#                                                       one libggml-cuda.so shared by the tools
#                                                       (STATIC=1: OFF, one executable a tool)
#   -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
#                                                       libcuda.so.1 (driver) is absent on the
#                                                       build machine (only the toolkit stub)
#   -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
#   -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF
#   Only the targets llama-bench, llama-batched-bench and llama-server are built (measured: 55 min with
#   FA while another build ran, 29 min without FA; nice 19, -j2, 2 cores).
#
#   Why FlashAttention is OFF: size.  A first build with FA (f16-f16 only) and static
#   linking gave two 47 MiB executables and a 21.6 MiB .tar.xz; the sm_90 fatbin alone
#   was 17.0 MB (nvcc-compressed; FA kernels 6.6 MB of it, MMQ 6.9 MB), over the
#   ~12 MiB carry budget.  Without FA llama.cpp still runs DeepSeek2/MLA models: the
#   CUDA backend reports FLASH_ATTN_EXT unsupported, `-fa auto` resolves to off, and
#   attention runs as KQ matmul + softmax + KQV matmul.  Caveat for comparisons: in
#   that path (src/llama-graph.cpp build_attn_mha) V is a view of the latent K cache,
#   not transposed, so each layer of each step does ggml_cont(ggml_transpose(v)) over
#   the whole cache: llama.cpp's long-context decode is slower than an FA build would
#   be.  Use -fa 0 (-fa 1 would push the attention to the CPU backend).
#   To build with FA instead: FA=1 scripts/build_llama_cuda.sh (payload ~+6 MiB xz).
#
# Output
#   $REPO/.llama-cuda/            (git-ignored: .gitignore)
#       llama-bench, llama-batched-bench, llama-server   stripped executables (RPATH $ORIGIN)
#       libggml*.so.0 libllama*.so.0 ...   the llama.cpp shared libraries they need
#                                          (stripped; none with STATIC=1, the executables hold
#                                          them); other deps: libcudart.so.13,
#                                          libcublas.so.13, libcublasLt.so.13,
#                                          libcuda.so.1 + glibc/libstdc++/libgcc_s
#       run-llama-bench.sh                 wrapper: finds the CUDA 13 libs, sets
#                                          LD_LIBRARY_PATH, execs the tool
#       README.txt                         commit, flags, dependency list
#   $REPO/.llama-cuda.tar.xz      (xz -9e; unpack on the GPU host with
#                                  `tar xJf .llama-cuda.tar.xz` in the repo root)
#
# Usage
#   scripts/build_llama_cuda.sh            configure + build + package
#   scripts/build_llama_cuda.sh --package  package an existing build only
#   scripts/build_llama_cuda.sh --source-tar OUT.tar.xz  the source a GPU host builds from itself (175 s
#                                          with FlashAttention on an H100 host's 16 cores; gpu_carry.sh LLAMA_SRC=1)
#   Env: LCPP_ROOT (default /tmp/lcpp), BUILD_DIR (default /tmp/lcpp-cuda-build),
#        JOBS (default 2), NICE (default 19), CUDA_HOME (default /usr/local/cuda),
#        FA (default 0; 1 = compile the FlashAttention kernels, f16 K/V only),
#        REPO (default: this script's repository), LLAMA_SRC (a source tree to build instead),
#        PACK (default 1; 0 = leave out .llama-cuda.tar.xz, for a build on the GPU host itself:
#        there LLAMA_SRC=... JOBS=16 NICE=0 PACK=0 STATIC=1 CUDA_HOME=<nvcc's prefix> takes minutes),
#        STATIC (default 0; 1 = one executable a tool, no llama.cpp shared libraries: where the
#        compiler links libstdc++ statically, as the Hopper hosts' /opt/gcc does, every shared
#        library gets its own copy, and std::regex's locale lookup across copies throws
#        std::bad_cast in llama-server's vocabulary load)
#   The build is long (sm_90 CUDA kernels; tens of minutes to > 1 h on 2 cores).
set -euo pipefail

LCPP_VERSION=0.3.36
LCPP_COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f
LCPP_ROOT=${LCPP_ROOT:-/tmp/lcpp}
SRC=${LLAMA_SRC:-$LCPP_ROOT/llama_cpp_python-$LCPP_VERSION/vendor/llama.cpp}
BUILD_DIR=${BUILD_DIR:-/tmp/lcpp-cuda-build}
JOBS=${JOBS:-2}
NICE=${NICE:-19}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
PKG=$REPO/.llama-cuda
TARGETS=(llama-bench llama-batched-bench llama-server)

FA=${FA:-0}
if [ "$FA" = 1 ]; then FA_FLAGS=(-DGGML_CUDA_FA=ON -DGGML_CUDA_FA_QUANTS=f16-f16); else FA_FLAGS=(-DGGML_CUDA_FA=OFF); fi
CMAKE_FLAGS=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS="$([ "${STATIC:-0}" = 1 ] && echo OFF || echo ON)"
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
  '-DCMAKE_INSTALL_RPATH=$ORIGIN'
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
  -DGGML_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES=90-real
  -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc"
  -DGGML_CUDA_COMPRESSION_MODE=none
  -DGGML_NATIVE=OFF
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  "${FA_FLAGS[@]}"
  -DGGML_CUDA_NCCL=OFF
  -DGGML_OPENMP=OFF
  -DGGML_CCACHE=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_OPENSSL=OFF
)

fetch_source() {
  [ -f "$SRC/CMakeLists.txt" ] && return 0
  echo "== fetching llama-cpp-python==$LCPP_VERSION sdist into $LCPP_ROOT"
  mkdir -p "$LCPP_ROOT"
  (cd "$LCPP_ROOT" &&
   python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$LCPP_VERSION" -d . &&
   tar xzf "llama_cpp_python-$LCPP_VERSION.tar.gz")
  [ -f "$SRC/CMakeLists.txt" ] || { echo "llama.cpp source not found at $SRC" >&2; exit 1; }
}

build() {
  fetch_source
  export PATH=$CUDA_HOME/bin:$PATH
  local t0; t0=$(date +%s)
  echo "== configure $SRC -> $BUILD_DIR ($(date))"
  nice -n "$NICE" cmake -S "$SRC" -B "$BUILD_DIR" "${CMAKE_FLAGS[@]}"
  echo "== build ${TARGETS[*]} with -j$JOBS ($(date))"
  nice -n "$NICE" cmake --build "$BUILD_DIR" --target "${TARGETS[@]}" -j "$JOBS"
  echo "== build done in $(( $(date +%s) - t0 )) s ($(date))"
}

package() {
  local bin=$BUILD_DIR/bin
  for t in "${TARGETS[@]}"; do
    [ -x "$bin/$t" ] || { echo "missing $bin/$t (build first)" >&2; exit 1; }
  done
  rm -rf "$PKG"; mkdir -p "$PKG"

  # Copy the tools and, transitively, every NEEDED library found in the build's bin/
  # (the llama.cpp shared libraries, under their soname).  Everything else must be a
  # CUDA library present on the GPU host or a base system library.
  local todo=("${TARGETS[@]}") done_=" " f lib bad=0 needed=""
  for t in "${TARGETS[@]}"; do cp "$bin/$t" "$PKG/$t"; done
  while [ ${#todo[@]} -gt 0 ]; do
    f=${todo[0]}; todo=("${todo[@]:1}")
    case "$done_" in *" $f "*) continue ;; esac
    done_="$done_$f "
    for lib in $(readelf -d "$PKG/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      if [ -e "$bin/$lib" ]; then
        [ -e "$PKG/$lib" ] || cp -L "$bin/$lib" "$PKG/$lib"
        todo+=("$lib")
      else
        needed="$needed $lib"
        case $lib in
          libcudart.so.13|libcublas.so.13|libcublasLt.so.13|libcuda.so.1) ;;
          libc.so.6|libm.so.6|libdl.so.2|libpthread.so.0|librt.so.1|ld-linux-x86-64.so.2|libstdc++.so.6|libgcc_s.so.1) ;;
          *) echo "unexpected dependency of $f: $lib" >&2; bad=1 ;;
        esac
      fi
    done
  done
  [ $bad = 0 ] || exit 1
  needed=$(tr ' ' '\n' <<< "$needed" | sed '/^$/d' | sort -u | tr '\n' ' ')
  local bundled
  bundled=$(cd "$PKG" && ls | { grep -v -x -e llama-bench -e llama-batched-bench -e llama-server || true; } | tr '\n' ' ')
  strip --strip-unneeded "$PKG"/*
  local glibc_max
  glibc_max=$(for f in "$PKG"/*; do objdump -T "$f"; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)

  cat > "$PKG/run-llama-bench.sh" <<'EOF'
#!/usr/bin/env bash
# run-llama-bench.sh [--batched] ARGS...
# Runs the packaged llama-bench (or llama-batched-bench with --batched, or any
# packaged tool via LLAMA_TOOL=name) with the CUDA 13 runtime/cuBLAS of this
# machine on LD_LIBRARY_PATH.  Search order for libcudart.so.13 and
# libcublas.so.13 (+ libcublasLt.so.13): $CUDA_HOME/lib64,
# /usr/local/cuda/lib64, /usr/local/cuda/targets/x86_64-linux/lib,
# /usr/local/cuda-13*/..., then the pip wheels under python3's `nvidia` package
# (nvidia/cu13/lib, nvidia/cublas/lib, nvidia/cuda_runtime/lib, nvidia/*/lib).
# libcuda.so.1 comes from the driver (ld.so.cache).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tool=${LLAMA_TOOL:-llama-bench}
if [ "${1:-}" = "--batched" ]; then tool=llama-batched-bench; shift; fi

dirs=()
for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib"} \
         /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib; do
  [ -d "$d" ] && dirs+=("$d")
done
nv=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))' 2>/dev/null || true)
if [ -z "$nv" ]; then   # namespace package without __file__
  nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
fi
if [ -n "$nv" ] && [ -d "$nv" ]; then
  for d in "$nv/cu13/lib" "$nv/cublas/lib" "$nv/cuda_runtime/lib" "$nv"/*/lib; do
    [ -d "$d" ] && dirs+=("$d")
  done
fi

find_lib() {  # print the first dir holding $1
  local d
  for d in "${dirs[@]}"; do [ -e "$d/$1" ] && { echo "$d"; return 0; }; done
  return 1
}
path=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  if d=$(find_lib "$lib"); then
    case ":$path:" in *":$d:"*) ;; *) path=${path:+$path:}$d ;; esac
  else
    echo "run-llama-bench.sh: $lib not found in: ${dirs[*]:-<none>}" >&2
    exit 127
  fi
done
export LD_LIBRARY_PATH=$here:$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -n "${LLAMA_WRAPPER_VERBOSE:-}" ] && echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >&2
exec "$here/$tool" "$@"
EOF
  chmod +x "$PKG/run-llama-bench.sh"

  {
    echo "llama.cpp CUDA build for sm_90 (H100/H200), made by scripts/build_llama_cuda.sh"
    echo
    echo "source : PyPI sdist llama-cpp-python==$LCPP_VERSION, vendor/llama.cpp"
    echo "commit : ggml-org/llama.cpp@$LCPP_COMMIT"
    echo "built  : $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm), $(. /etc/os-release; echo "$PRETTY_NAME")"
    echo "nvcc   : $("$CUDA_HOME/bin/nvcc" --version | tail -1)"
    echo "cxx    : $(c++ --version | head -1)"
    echo "cmake  : ${CMAKE_FLAGS[*]}"
    echo "targets: ${TARGETS[*]} (stripped; RPATH \$ORIGIN)"
    echo "bundled: $bundled"
    echo "needs  : $needed(not bundled: CUDA 13 from the GPU host, base system)"
    echo "glibc  : highest symbol version needed $glibc_max"
    echo
    echo "Usage (GPU host, repo root):"
    echo "  .llama-cuda/run-llama-bench.sh -m model.gguf -ngl 99 -fa $FA -p 512 -n 0 -o json"
    echo "  .llama-cuda/run-llama-bench.sh --batched -m model.gguf -ngl 99 -fa $([ "$FA" = 1 ] && echo on || echo off) -c 16384 -pps -npp 128 -ntg 128 -npl 1,8,32 --output-format jsonl"
    if [ "$FA" = 1 ]; then
      echo "FlashAttention kernels are compiled (f16 K/V only): use -fa 1 with the default f16 KV cache."
    else
      echo "Built WITHOUT FlashAttention kernels (GGML_CUDA_FA=OFF): use -fa 0; -fa 1 would run"
      echo "the attention on the CPU.  Note that llama.cpp's non-FA MLA path transposes the latent"
      echo "cache every layer/step, so long-context decode is slower than an FA build."
    fi
  } > "$PKG/README.txt"

  echo "== package: $PKG"
  ls -l "$PKG"
  echo "bundled: $bundled"
  echo "NEEDED (not bundled): $needed"
  echo "highest GLIBC version: $glibc_max"
  rm -f "$REPO/.llama-cuda.tar.xz"
  if [ "${PACK:-1}" = 1 ]; then
    (cd "$REPO" && tar cf - .llama-cuda | xz -9e -T1 > .llama-cuda.tar.xz)
    ls -l "$REPO/.llama-cuda.tar.xz"
  fi
  du -sb "$PKG"
}

# The source a GPU host needs to build the three tools itself (7 MB xz: no models, docs, tests or
# web UI; scripts/ui-assets.cmake embeds no UI assets then), unpacked and built there with
# LLAMA_SRC=<its llama.cpp> JOBS=$(nproc) NICE=0 PACK=0 (scripts/gpu_serve_bench.sh does so)
source_tar() {
  fetch_source
  local out; out=$(realpath -m "$1")
  (cd "$SRC/.." && tar cf - --exclude=llama.cpp/tools/server/webui --exclude='*.png' --exclude='*.jpg' \
     llama.cpp/CMakeLists.txt llama.cpp/cmake llama.cpp/common llama.cpp/ggml llama.cpp/include llama.cpp/src \
     llama.cpp/tools llama.cpp/vendor llama.cpp/LICENSE llama.cpp/licenses llama.cpp/scripts/ui-assets.cmake) |
    xz -T2 -6 >"$out"
  ls -l "$out"
}

case "${1:-}" in
  --package) package ;;
  --source-tar) [ -n "${2:-}" ] || { echo "usage: $0 --source-tar OUT.tar.xz" >&2; exit 2; }; source_tar "$2" ;;
  "") build; package ;;
  *) echo "usage: $0 [--package | --source-tar OUT.tar.xz]" >&2; exit 2 ;;
esac
