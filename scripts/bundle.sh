#!/usr/bin/env bash
# `make bundle`: a relocatable release tree of mlaserve with the CUDA backend, for a machine that
# has only the NVIDIA driver (libcuda) and NCCL, as a GPU host often is.
#   scripts/bundle.sh [DEST]        (default .bundle; env ARCH="90;100;120", BUILD=build-bundle,
#                                   BUNDLE_CMAKE_ARGS: more cmake options, e.g. -DMLA_DEV_SWITCHES=ON)
# DEST/bin: mlaserve, mlaserve-worker (and mlaserve-coordinator when built); DEST/share: what
# `cmake --install` puts there (share/mlaserve: deploy files, the tiny model, the Dockerfile;
# share/doc/mlaserve), so that the bundle has the install layout (the Dockerfile copies it);
# DEST/lib: every shared library `ldd` shows that is not glibc, libstdc++/libgcc_s, the driver
# (libcuda) or NCCL. The binaries carry DT_RPATH $ORIGIN/../lib (--disable-new-dtags, so that it
# also serves the bundled libraries' own dependencies: libzmq -> libsodium, libpgm, ...). The CUDA
# runtime is linked statically (CMake's default for CUDA executables). Built on glibc 2.36: runs on
# newer glibc (Ubuntu 24.04: 2.39). Ends with a check that the bundle resolves every library from
# DEST/lib or the system's base set with LD_LIBRARY_PATH unset.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.bundle}"
ARCH="${ARCH:-90;100;120}"
BUILD="${BUILD:-build-bundle}"
export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMLA_CUDA=ON -DBUILD_TESTING=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_RUNTIME_LIBRARY=Static -DCMAKE_C_FLAGS="-Wno-maybe-uninitialized" \
  -DCMAKE_EXE_LINKER_FLAGS='-Wl,--disable-new-dtags -Wl,-rpath,\$ORIGIN/../lib' ${BUNDLE_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target mlaserve mlaserve-worker
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
bins=("$BUILD/coordinator/mlaserve" "$BUILD/worker/mlaserve-worker")
[ -x "$BUILD/coordinator/mlaserve-coordinator" ] && bins+=("$BUILD/coordinator/mlaserve-coordinator")
cp "${bins[@]}" "$DEST/bin/"
cmake --install "$BUILD" --prefix "$DEST" --component share >/dev/null
# system libraries every glibc Linux has (left out), the driver and NCCL (from the GPU host)
skip='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libnccl)\.'
for b in "$DEST"/bin/*; do
  ldd "$b" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -e "$DEST/lib/$name" ] || cp -L "$path" "$DEST/lib/$name"
  done
done
# check: with LD_LIBRARY_PATH unset, every non-system library resolves into DEST/lib
bad=0
for b in "$DEST"/bin/*; do
  readelf -d "$b" | grep -q 'RPATH.*\$ORIGIN/../lib' || { echo "bundle: $b has no RPATH \$ORIGIN/../lib" >&2; bad=1; }
  while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    case "$(realpath -m "$path")" in "$(cd "$DEST/lib" && pwd -P)"/*) ;; *) echo "bundle: $b: $name -> $path (not bundled)" >&2; bad=1 ;; esac
  done < <(env -u LD_LIBRARY_PATH ldd "$b" | awk '/=> /{print $1, $3}')
done
[ "$bad" = 0 ] || exit 1
echo "bundle: $DEST ($(du -sh "$DEST" | cut -f1)): bin: $(ls "$DEST/bin" | tr '\n' ' ')"
echo "bundle: lib: $(ls "$DEST/lib" | tr '\n' ' ')"
echo "bundle: max GLIBC symbol version needed: $(objdump -T "$DEST"/bin/* "$DEST"/lib/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
